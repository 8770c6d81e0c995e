"""The memory's read bandwidth: what a program whose weights exceed the last-level cache pays
for them on every call (``db.cost.CostModel.from_memory``, rate "read").

Measured where it is first needed: ``tg profile``'s calibration (``commands/calibrate.py``)
stores it with the other rates, and ``profile="missing"`` measures it once per database and
device when a program it plans streams its weights and no rate is stored (before, the cost
model takes the copy bandwidth, "bytes", which on this machine reads ~10 GB/s uncalibrated
against ~25 GB/s measured).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from tensor_graphs import threads
from tensor_graphs.db.cost import last_level_cache
from tensor_graphs.db.hardware import Hardware

# the array read: eight last-level caches, at least this. A smaller one is read partly from
# the cache (this Zen 5's 32 MiB L3 does not evict in strict LRU order): four rounds
# interleaved at load 5.3 read 32-64 GB/s over 128 MiB, 17-22 over 256 MiB, 13-19 over 512
MIN_BYTES = 256 << 20


def read_bandwidth(n_threads: int | None = None, repeats: int = 7,
                   size: int | None = None) -> float:
    """Bytes per second ``n_threads`` threads (the runtime's team by default: a decode's GEMVs
    read with all of it) read from memory, each OR-reducing its share of a uint64 array eight
    times the last-level cache (numpy releases the GIL while it reduces); the best of
    ``repeats`` samples, since on a shared machine other work only lowers it. An OR keeps up
    with memory on one core where a float32 sum (pairwise adds) does not: 22 against 34 GB/s
    on one core here (``benchmarks/generate.py``'s ``ReadBandwidth``, the same measure)."""
    n = max(1, n_threads or threads.get_num_threads())
    total = size or max(MIN_BYTES, 8 * last_level_cache())
    data = np.ones(total // 8, np.uint64)
    parts = np.array_split(data, n)
    best = float("inf")
    with ThreadPoolExecutor(n) as pool:
        list(pool.map(np.bitwise_or.reduce, parts))  # pages touched, threads started
        for _ in range(max(1, repeats)):
            start = time.perf_counter()
            list(pool.map(np.bitwise_or.reduce, parts))
            best = min(best, time.perf_counter() - start)
    return data.nbytes / best


def ensure_read_rate(db, hardware: Hardware) -> float | None:
    """The "read" rate stored for ``hardware`` in ``db``, measured and stored beside the
    other rates first when there is none; None where the database cannot be written (the
    cost model then keeps its fallback)."""
    stored = db.calibration(hardware) or {}
    if "read" in stored:
        return float(stored["read"])
    if db.readonly:
        return None
    rate = read_bandwidth()
    db.set_calibration(hardware, {**stored, "read": rate})
    return rate
