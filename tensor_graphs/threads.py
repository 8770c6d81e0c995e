"""One thread count for the pools tensor_graphs runs: OpenBLAS, OpenMP (the C kernels) and,
when asked, torch.

    import tensor_graphs as tg
    tg.threads.set_num_threads(2)   # or TG_NUM_THREADS=2 in the environment
    tg.threads.get_num_threads(), tg.threads.source()

Where the count comes from, the first that applies (``source()`` names it):

==================  =====================================================================
``set_num_threads`` a call of it (it also sets torch, which then uses the same count)
``TG_NUM_THREADS``  the environment variable (also sets torch, as the call does)
``OMP_NUM_THREADS`` the environment variable (its first entry), which torch reads too
``torch``           ``torch.get_num_threads()``, when torch was imported before the count was
                    first needed (the first C kernel, ``get_num_threads``) and the user
                    changed it (``torch.set_num_threads(1)`` before importing tensor_graphs)
``cores``           the cores this process may run on
==================  =====================================================================

Only the first two change torch's count: otherwise torch keeps its own (the user's, or its
default), so importing or using tensor_graphs never resets a ``torch.set_num_threads`` the
user made (it used to: libgomp's ``omp_set_num_threads``, called for every setting, is also
the count torch reads). The count is resolved once, when first needed.

The C kernels' parallel regions use at most that count: while the cores are oversubscribed
(the calling thread waits for a core an eighth or more of the time it wants one, as
``/proc/thread-self/schedstat`` counts it, in two decisions in a row), they run on the calling
thread alone and try the whole team again half a second after the last such look (``tg_team`` in
``kernels/c/tg_common.h``: a region waits for its slowest thread, and one that lost its core
to another process held every region up for a scheduler slice; ``team()`` says which now).
numpy's own OpenBLAS follows the team inside ``numpy_matmul`` (``blas_follows_team``: one
OpenBLAS call waits for every worker just the same), and keeps the setting outside it.

Pools that take turns must also stop spinning soon after their turn, or an idle pool's
busy-waiting threads steal the cores from the next one (measured on 2 cores: a layer_norm right
after an sgemm took 3.5 ms instead of 0.2 ms; GPT-2 2-layer prefill 192 ms instead of 86 ms).
Importing this module therefore sets, unless already set, ``OPENBLAS_THREAD_TIMEOUT=4``
(OpenBLAS workers sleep almost at once) and ``GOMP_SPINCOUNT=10000`` (libgomp workers spin
~0.2 ms, at ~23 ns a pause on a Zen 5 VM, then sleep). Not shorter: a worker that sleeps
between two of our calls is woken through the hypervisor, and on a 2-vCPU VM that left it out
of the next calls for ~50 ms after any idle spell (a (128x768) @ (768x2304) GEMM after a
0.25 s pause: 4.6 ms for the first dozen calls at GOMP_SPINCOUNT=1000, 2.2 ms from the first at
10000; GPT-2 2-layer's first prefill after 1 s idle: 71-91 ms against 67-71), while a torch op
right after our GEMM measured the same at 1000 and 10000. Under contention the shrunken team
keeps the C kernels from spinning. Both are read when those libraries load, so ``import
tensor_graphs`` imports this module before anything loads numpy; numpy or torch imported
*before* tensor_graphs keep spinning pools, and the import warns once naming them
(``late_pools``).

The BLAS and OpenMP pools' counts are set through ``threadpoolctl``, which knows every such
library's setter. What it does not cover stays here: the spin settings (environment read at
library load, not a runtime call), torch's own intra-op count (set only when the user asked
tensor_graphs for a count), and the C kernels' team (one shared state their regions read).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
import time
import warnings

from tensor_graphs.errors import ArgumentError

SPIN_SETTINGS = {"OPENBLAS_THREAD_TIMEOUT": "4", "GOMP_SPINCOUNT": "10000"}
# pools already loaded without these settings: (module that loaded it, its pool, the variable)
_LATE = (("numpy", "numpy's OpenBLAS", "OPENBLAS_THREAD_TIMEOUT"),
         ("torch", "torch's OpenMP", "GOMP_SPINCOUNT"))


def _importer_level() -> int:
    """The ``stacklevel`` of the user's ``import`` line: this module runs inside the
    package's own imports, and a warning pointing at those says nothing about where to move
    the import (``warnings`` itself skips importlib's frames, so they are not counted)."""
    frame, level = sys._getframe(1), 1
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith("<frozen "):
            if not os.path.abspath(name).startswith(package):
                return level
            level += 1
        frame = frame.f_back
    return 1


late_pools = [pool for module, pool, var in _LATE
              if module in sys.modules and var not in os.environ
              and not (var == "GOMP_SPINCOUNT" and "OMP_WAIT_POLICY" in os.environ)]
for _var, _value in SPIN_SETTINGS.items():
    os.environ.setdefault(_var, _value)
if late_pools and (os.cpu_count() or 1) > 1:
    warnings.warn(
        f"tensor_graphs was imported after {' and '.join(late_pools)} had started, so idle "
        "threads of those pools keep spinning after each call and slow plans that mix "
        "backends (up to 2x on 2 cores). Import tensor_graphs before numpy and torch, or set "
        + " ".join(f"{k}={v}" for k, v in SPIN_SETTINGS.items()) + " in the environment.",
        RuntimeWarning, stacklevel=_importer_level())

_lock = threading.RLock()
_count: int | None = None
_source: str | None = None
_libraries: list = []  # C-backend libraries exporting tg_set_threads(int)
# The C kernels' team state, one for the process (tg_common.h's TG_T_* slots; each library
# gets its address through tg_share_team): [0] the setting, [1] the team regions use now.
_team = (ctypes.c_int64 * 10)(1, 1)  # TG_T_N slots
_PINNED = 8  # TG_T_PINNED
# sources whose count torch follows too: the user asked tensor_graphs for it
_SETS_TORCH = ("set_num_threads", "TG_NUM_THREADS")


def cores() -> int:
    """How many cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _env_count(var: str) -> int | None:
    """The count in ``var`` (OMP_NUM_THREADS may list one per nesting level: the first), or
    None when unset or empty."""
    raw = os.environ.get(var, "").split(",")[0].strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ArgumentError(f"{var} must be a positive integer, got {os.environ[var]!r}: set it "
                            f"to the number of threads (e.g. {var}={cores()}) or unset it")
    return n


def _torch_default() -> int:
    """torch's own default count (ATen's intraop_default_num_threads): OMP_NUM_THREADS, else
    MKL_NUM_THREADS, else the physical cores."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        try:
            n = _env_count(var)
        except ArgumentError:
            n = None
        if n:
            return n
    try:
        root = "/sys/devices/system/cpu"
        physical = set()
        for name in os.listdir(root):
            if name.startswith("cpu") and name[3:].isdigit():
                topo = os.path.join(root, name, "topology")
                with open(os.path.join(topo, "physical_package_id")) as f:
                    package = f.read().strip()
                with open(os.path.join(topo, "core_id")) as f:
                    physical.add((package, f.read().strip()))
        if physical:
            return len(physical)
    except OSError:
        pass
    return os.cpu_count() or 1


def _resolve() -> tuple[int, str]:
    """The count and where it comes from, in the order of the module's docstring."""
    for var in ("TG_NUM_THREADS", "OMP_NUM_THREADS"):
        n = _env_count(var)
        if n is not None:
            return n, var
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_num_threads"):
        n = torch.get_num_threads()
        if n >= 1 and n != _torch_default():
            return n, "torch"
    return cores(), "cores"


def get_num_threads() -> int:
    """The thread count of tensor_graphs' pools (resolved on first use; see the module)."""
    with _lock:
        if _count is None:
            _apply(*_resolve())
        return _count


def source() -> str:
    """Where the count comes from: set_num_threads, TG_NUM_THREADS, OMP_NUM_THREADS, torch or
    cores."""
    with _lock:
        get_num_threads()
        return _source


def team() -> int:
    """The threads the C kernels' parallel regions use now: ``get_num_threads()``, or 1 while
    the cores are oversubscribed."""
    get_num_threads()
    return int(_team[0] if _team[_PINNED] > 0 else _team[1])


@contextlib.contextmanager
def full_team():
    """Within: the C kernels' regions use every thread of the setting, contended or not. The
    profiler measures under it, since a plan made from times measured on one thread while the
    machine was busy would stay slow once it is quiet."""
    with _lock:
        _team[_PINNED] += 1
    try:
        yield
    finally:
        with _lock:
            _team[_PINNED] -= 1


def set_num_threads(n: int) -> None:
    """Use ``n`` threads in OpenBLAS, OpenMP (our C libraries) and torch, together."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ArgumentError(f"set_num_threads: need a positive integer, got {n!r}")
    _apply(n, "set_num_threads")


def _apply(n: int, source: str) -> None:
    global _count, _source, _foreign_blas
    with _lock:
        _count, _source, _foreign_blas = n, source, None
        _set_openblas(n)
        _team[0] = _team[1] = n
        for lib in _libraries:
            lib.tg_set_threads(n)
        if source in _SETS_TORCH:
            _set_openmp(n)  # torch's count too: it reads omp_get_max_threads
            sync_torch()


def sync_torch() -> None:
    """torch was imported: it follows the count when the user asked tensor_graphs for one
    (``set_num_threads``, ``TG_NUM_THREADS``); otherwise it keeps its own."""
    torch = sys.modules.get("torch")
    with _lock:
        if _source not in _SETS_TORCH or torch is None or not hasattr(torch, "set_num_threads"):
            return
        if torch.get_num_threads() != _count:
            try:
                torch.set_num_threads(_count)
            except RuntimeError:
                pass


def register_library(lib) -> None:
    """Called by the C backend for each library it loads that exports ``tg_set_threads``."""
    with _lock:
        fn = getattr(lib, "tg_set_threads", None)
        if fn is None:
            return
        fn.argtypes = [ctypes.c_int]
        fn.restype = None
        n = get_num_threads()
        share = getattr(lib, "tg_share_team", None)
        if share is not None:  # the state holds the setting and the team now: keep the team
            share.argtypes = [ctypes.c_void_p]
            share.restype = None
            share(ctypes.addressof(_team))
        else:
            fn(n)
        _libraries.append(lib)


def _load_scipy_openblas() -> str | None:
    """The C backend's BLAS (scipy-openblas32), loaded now if it is not yet, so that its pool
    has the count before the first C library linking it is loaded; its path, or None without
    the package. threadpoolctl only sees libraries already in the process."""
    try:
        import scipy_openblas32
    except ImportError:
        return None
    path = os.path.join(scipy_openblas32.get_lib_dir(), f"lib{scipy_openblas32.get_library()}.so")
    try:
        ctypes.CDLL(path)
    except OSError:
        return None
    return path


def _limit(n: int, user_api: str) -> None:
    """Every pool of ``user_api`` ("blas": OpenBLAS builds, MKL, BLIS, FlexiBLAS; "openmp":
    libgomp, libomp, libiomp) loaded in this process set to ``n`` threads, by threadpoolctl."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=n, user_api=user_api)


def _set_openblas(n: int) -> None:
    _load_scipy_openblas()
    _limit(n, "blas")


def _set_openmp(n: int) -> None:
    _limit(n, "openmp")


def openblas_num_threads() -> int | None:
    """The thread count scipy-openblas32 reports (for checks), or None without it."""
    path = _load_scipy_openblas()
    if path is None:
        return None
    from threadpoolctl import threadpool_info

    real = os.path.realpath(path)
    for pool in threadpool_info():
        if os.path.realpath(pool["filepath"]) == real:
            return int(pool["num_threads"])
    return None


# --- other BLAS pools follow the team while our kernels call them ---------------------------
# numpy's own OpenBLAS (and any BLAS that is not the C backend's, which blas.c keeps on the team
# itself): (controller's set_num_threads, the count set now). Found once, after the count.
_foreign_blas: list | None = None
_LOOK_NS = 10_000_000  # tg_common.h's TG_TEAM_LOOK_NS: look at most every 10 ms
_AT = 2  # TG_T_AT: ns of the last look


def _foreign_pools() -> list:
    global _foreign_blas
    if _foreign_blas is None:
        from threadpoolctl import ThreadpoolController

        ours = _load_scipy_openblas()
        ours = os.path.realpath(ours) if ours else None
        _foreign_blas = [c for c in ThreadpoolController().select(user_api="blas").lib_controllers
                         if os.path.realpath(c.filepath) != ours]
    return _foreign_blas


def _look() -> int:
    """The team now, looked at again (as a C region's ``tg_team`` does) when the last look is
    older than 10 ms: a program of numpy kernels alone runs no C region to look for it."""
    n = get_num_threads()
    if n <= 1 or _team[_PINNED] > 0:
        return n
    now = time.monotonic_ns()  # CLOCK_MONOTONIC, as tg_now_ns
    if now - _team[_AT] >= _LOOK_NS and _libraries:
        try:
            with open("/proc/thread-self/schedstat") as f:
                run, wait = (int(v) for v in f.read().split()[:2])
        except (OSError, ValueError):
            _team[_AT] = now  # no counters: the team stays the setting
        else:
            look = _libraries[0].tg_team_look
            look.argtypes = [ctypes.c_int64] * 4
            look.restype = ctypes.c_int
            look(now, run, wait, threading.get_ident())  # get_ident is pthread_self
    return int(_team[1])


@contextlib.contextmanager
def blas_follows_team():
    """Within: every BLAS pool but the C backend's (numpy's own OpenBLAS) uses the C kernels'
    team, as ``c_matmul``'s OpenBLAS does (blas.c): one thread while other processes want the
    cores; after, the setting again, so a user's own numpy calls keep their count.

    Why: an OpenBLAS call waits for every worker, and a worker that lost its core holds the call
    up for a scheduler slice. numpy's matmul makes one such call per batch entry. Measured on 2
    cores at load 7-8 (other processes' tests), (8, 128, 256) @ (256, 256) float32 through
    numpy.matmul: 35 ms median back to back (0.76 ms at the 10th percentile), 39 ms right after
    a C kernel, 171 ms after a C kernel and a 1 ms pause (its workers asleep,
    OPENBLAS_THREAD_TIMEOUT=4); on one thread 1.16-1.19 ms in all three, as c_matmul_strided's
    1.08-1.11. The profiler times a kernel's fastest uncontended take (``profiler.measure``), so
    the database put numpy_matmul at ~0.6 ms, and the training step's plan (issue 22) spent 667
    of 1354 ms in 24 such calls. With the pool on the team, the plan runs numpy's BLAS the way
    it runs ours, and the profiler's full team (``full_team``) measures both alike. Costs a
    look every 10 ms (~5 us) and, only while the team is short, a getter and two setter calls
    per pool."""
    n = _look()
    if n == _count:
        yield
        return
    # only pools above the team, and each back to its own count (a user's threadpool_limits)
    wide = [(pool, was) for pool in _foreign_pools() if (was := pool.get_num_threads()) > n]
    for pool, _ in wide:
        pool.set_num_threads(n)
    try:
        yield
    finally:
        for pool, was in wide:
            pool.set_num_threads(was)
