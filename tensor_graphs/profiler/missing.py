"""``profile="missing"``: measure every kernel call a plan considered that has no row.

The planner has already listed every option of every slot it visited; the calls worth
measuring are its kernel options whose estimate is not a measurement on this hardware (one per
kernel and signature). The float64-reference kernels (numpy_exact_*) are measured only where a
slot has nothing else. Generated kernels (a candidate at every node: each a compile, a
verification and a timing) are measured only where a plan on their optimistic times picks them
(``could_win``, ``db/generated_cost.py``), in rounds until it picks none: GPT-2 2-layer's
fresh profile measures 5 of its 40 generated candidates and plans as if it had measured all.
The same rule (``gated``) holds a GPU plan's host-side options: kernels on the host and the
copies that only reach them. The planner offers "copy to the host, run there, copy back" at
every step of a GPU plan, and such a step pays two copies (13-17 us tiny, 40-150 us at
(1,128,768) on an H100) against GPU kernels of 6-50 us: measuring them all, GPT-2 124M's first
GPU profile filed 144 host rows of 232 and had not finished after 223 s. They wait until the
GPU's own options and the copies a plan needs anyway (a fed leaf's up, an output's down) have
rows (the first round), then go in the optimistic rounds at estimate / uncertainty. A CPU
plan has no host-side options: it is measured as before.
Each kernel is verified (``tg.kernels.verify``) before its first measurement; one that fails
verification is recorded as a failure and never measured.

GPU kernels (torch CUDA kernels, generated kernels for "cuda") and the copies between host and
GPU are measured too when a GPU is usable, on the GPU (``device.DeviceIO``: inputs moved there
once, samples synchronized), and filed under the GPU's hardware key (the cost model's
``hardware[measured_on(kernel)]``), so they never mix with CPU rows. The simulated GPU
(``TG_SIMULATED_CUDA``) is measured the same way under a key of its own: CPU times that say
nothing about a GPU, kept apart from a real GPU's rows.

The calls go in the graph's order (a slot's options, and those of the slots next to it, side by
side) and are timed ``WINDOW`` at a time in interleaved rounds (``measure_together``), so a
fused kernel and the unfused steps it competes with are measured under the same load. A window
holds the calls of one device (claims are per hardware key).

Profilers sharing a database file split the work: before measuring a window each claims its
calls in the database (``Database.claim``), skipping calls another live profiler holds, and
waits at the end for those to be recorded. A claim is a lease its owner renews from a thread
every third of ``LEASE_SECONDS`` while alive; a killed profiler's claims expire and are taken
over, so no one waits on a dead one. Three profilers on one file used to measure everything
three times (600 rows for 200 calls). On a read-only database the rows go into a private
in-memory copy (``Database.record_in_memory``, warned once): plans of this process use them,
nothing is kept.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence

from tensor_graphs.db import generated_cost
from tensor_graphs.db.cost import is_exact_kernel, measured_on
from tensor_graphs.db.generated_cost import Optimistic
from tensor_graphs.db.hardware import Hardware, current
from tensor_graphs.db.store import Database, Measurement
from tensor_graphs.devices import cuda_available
from tensor_graphs.errors import DatabaseError
from tensor_graphs.kernels import generated
from tensor_graphs.planner.plan import COPY, KERNEL, Option
from tensor_graphs.planner.search import Planner
from tensor_graphs.profiler import shared_verify
from tensor_graphs.profiler.bandwidth import ensure_read_rate
from tensor_graphs.profiler.measure import Call, measure_together
from tensor_graphs.progress import Progress

# True: every generated kernel the planner offers is measured, as before the calibrated
# estimates (GPT-2 2-layer's fresh profile: 314 calls); benchmarks/fresh_profile.py compares
MEASURE_EVERY_GENERATED = False
# True: every host-side option of a GPU plan is measured, as before they were gated (GPT-2
# 124M's first GPU profile: 144 host rows of 232, unfinished after 223 s on an H100)
MEASURE_EVERY_HOST = False
_verified: dict[str, str | None] = {}  # kernel name -> None when it passed, else the reason
WINDOW = 8  # calls timed together in interleaved rounds (their arrays are alive together)
LEASE_SECONDS = 30.0  # a claim's life unless renewed: how long a dead profiler's work waits


def calls_to_measure(planner: Planner) -> list[Option]:
    """The planner's kernel and copy options without a row, one per (kernel, signature), in
    the order of the slots (bottom-up: a node's options next to those of its inputs). GPU
    kernels and host<->GPU copies only when a GPU (real or simulated) is usable here. Not
    static steps (``Option.static``: a weight's transpose, quantization or rounding, its copy
    to the GPU): they run once per binding and the planner weighs them at a thousandth of
    their time, so their rows decide nothing a call pays, and measuring them was most of a
    quantized model's profile (GPT-2 124M bf16-weight: ``bf16_round``'s decomposition over
    every weight, each checked in float64, 1290 s at load ~10)."""
    found: dict[tuple[str, str], Option] = {}
    gpu = None
    for options in planner._options.values():
        alternatives = [o for o in options if o.how in (KERNEL, COPY)]
        for o in alternatives:
            if o.estimate.source in ("measured", "free", "failed") or o.static:
                continue
            if measured_on(o.kernel) != "cpu":
                if gpu is None:
                    gpu = cuda_available()
                if not gpu:
                    continue
            if is_exact_kernel(o.kernel) and len(alternatives) > 1:
                continue
            found.setdefault((o.kernel.name, o.signature), o)
    return list(found.values())


def hardware_of(o: Option, hardware: Mapping[str, Hardware] | None) -> Hardware:
    """The key ``o``'s row is filed under: the cost model's for the kernel's device kind (so
    the planner finds it), else this process's."""
    return _hardware_for(o.kernel, hardware)


def _hardware_for(kernel, hardware: Mapping[str, Hardware] | None) -> Hardware:
    kind = measured_on(kernel)
    return (hardware or {}).get(kind) or current(kind)


def _verify_gpu_kernels_at_once(options: Sequence[Option],
                                hardware: Mapping[str, Hardware] | None, scope: str | None,
                                progress: bool) -> None:
    """The registered GPU kernels of the first round verified in worker processes at once
    (``shared_verify.verify_at_once``: where the cores allow, for a database profilers
    share), before anything is timed: a Triton kernel's checks compile it once per
    specialization they meet, seconds each, which the measuring would otherwise wait for
    kernel by kernel. Copies and host kernels verify in milliseconds: not worth a process."""
    kernels = {o.kernel.name: o.kernel for o in options
               if o.how == KERNEL and not _generated(o) and o.kernel.name not in _verified
               and measured_on(o.kernel) != "cpu"}
    if kernels:
        shared_verify.verify_at_once(list(kernels.values()),
                                     lambda k: _hardware_for(k, hardware), scope,
                                     progress=progress)


def verified(kernel, hw: Hardware | None = None, scope: str | None = None) -> str | None:
    """None when ``kernel`` passes verification, else why not: cached per process, and shared
    by the profilers of this machine (``shared_verify``: the first to need it verifies it, the
    others wait and read the outcome), ``hw`` its hardware key (default this machine's for the
    kernel's device), ``scope`` the database the profilers share (``shared_verify.scope_of``;
    None: not shared). A generated kernel is built first (``generated.realize``: compiled, then
    checked against the float64 reference); one that fails is never timed."""
    if kernel.name not in _verified:
        _verified[kernel.name] = shared_verify.shared(
            kernel, hw or current(measured_on(kernel)), lambda: shared_verify.check(kernel),
            scope)
    return _verified[kernel.name]


def call_of(o: Option, hardware: Mapping[str, Hardware] | None = None) -> Call:
    """The option's kernel call (a generated kernel already built: see ``verified``). A copy
    is called with its target device, as its signature names it."""
    args = tuple(n.node for n in o.needs)
    node = getattr(o.kernel, "computes", None)
    node = o.slot.node if node is None else node  # (not `or`: a 0-d node has no truth value)
    attrs = dict(o.attrs)
    if o.how == COPY and "device" in o.kernel.attrs:
        attrs["device"] = o.slot.device
    return Call(generated.realize(o.kernel), node, args, attrs, o.signature,
                o.features.flops, o.features.bytes, hardware_of(o, hardware))


def measure_options(options: list[Option], hardware: Mapping[str, Hardware] | None = None,
                    scope: str | None = None):
    """Verify each option's kernel (once per process; once per machine among the profilers
    of database ``scope``, ``shared_verify.scope_of``), then measure the calls ``WINDOW`` at
    a time in interleaved rounds; yields (option, Measurement) per window, in order, each row
    keyed by ``hardware_of``. A kernel that fails verification gives a failure row and is
    never timed."""
    nan = float("nan")
    for i in range(0, len(options), WINDOW):
        window = options[i:i + WINDOW]
        failures = {id(o): verified(o.kernel, hardware_of(o, hardware), scope)
                    for o in window}
        timed = [o for o in window if failures[id(o)] is None]
        rows = dict(zip(map(id, timed),
                        measure_together([call_of(o, hardware) for o in timed])))
        yield [(o, rows.get(id(o)) or Measurement(
            o.kernel.name, o.kernel.source_hash, o.signature, 0, nan, nan, nan, None,
            f"verification failed: {failures[id(o)]}", hardware_of(o, hardware)))
            for o in window]


class Claims:
    """This process's claims in ``db``: taken a window at a time, renewed by a daemon thread
    every third of ``lease`` while the process lives, released by ``record`` (row by row) or
    by ``release``. The owner id (host, pid, random) is new per instance, so a reused pid
    never inherits a dead process's claims."""

    def __init__(self, db: Database, lease: float):
        self.db, self.lease = db, float(lease)
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def take(self, options: Sequence[Option], limit: int,
             hardware: Hardware | None = None) -> list[str]:
        """``Database.claim`` for the options' calls on ``hardware``, in order."""
        states = self.db.claim([(o.kernel.name, o.kernel.source_hash, o.signature)
                                for o in options], self.owner, self.lease, limit, hardware)
        if "claimed" in states and self._thread is None:
            self._thread = threading.Thread(target=self._renew, name="tg-profiler-claims",
                                            daemon=True)
            self._thread.start()
        return states

    def _renew(self) -> None:
        while not self._stop.wait(self.lease / 3):
            try:
                self.db.renew(self.owner, self.lease)
            except DatabaseError:  # closed under us: the claims die with their lease
                return

    def release(self) -> None:
        self.db.release(self.owner)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self.release()
        except DatabaseError:
            pass


class Work:
    """``options`` measured window by window (iterate: one list of (option, Measurement) per
    window, which the caller records), split with the other profilers of ``db``. The calls
    another profiler holds are waited for (polled, each poll a quarter lease or 0.5 s) until
    recorded or their lease expires; ``deadline`` (a ``time.monotonic()``) stops the walk
    after the window that passes it. Afterwards ``pending`` is what no one recorded (out of
    time) and ``by_others`` how many calls others recorded."""

    def __init__(self, db: Database, options: Sequence[Option], lease: float | None = None,
                 deadline: float | None = None,
                 hardware: Mapping[str, Hardware] | None = None):
        self.db, self.deadline, self.hardware = db, deadline, hardware
        self.lease = LEASE_SECONDS if lease is None else float(lease)
        self.pending = list(options)
        self.by_others = 0

    def __iter__(self) -> Iterator[list[tuple[Option, Measurement]]]:
        claims = Claims(self.db, self.lease)
        scope = shared_verify.scope_of(self.db)
        keys = {id(o): hardware_of(o, self.hardware) for o in self.pending}
        held: set[Hardware] = set()  # devices whose pending calls others hold, since a wait
        started = False
        try:
            while self.pending:
                if started and self.deadline is not None and time.monotonic() > self.deadline:
                    return
                # the next window: calls of one device, claimed under its key, first the device
                # of the first pending call that is not all held by others
                hw = next((keys[id(o)] for o in self.pending if keys[id(o)] not in held), None)
                if hw is None:  # all held by live profilers: wait for their rows
                    time.sleep(min(0.5, self.lease / 4))
                    held.clear()
                    continue
                same = [o for o in self.pending if keys[id(o)] == hw]
                states = dict(zip(map(id, same), claims.take(same, WINDOW, hw)))
                window = [o for o in same if states[id(o)] == "claimed"]
                self.by_others += sum(1 for s in states.values() if s == "done")
                self.pending = [o for o in self.pending
                                if states.get(id(o), "later") in ("held", "later")]
                started = True
                if not window:
                    held.add(hw)
                    continue
                yield from measure_options(window, self.hardware, scope)
                claims.release()  # what the caller did not record
        finally:
            claims.close()


def _key(o) -> tuple[str, str]:
    return o.kernel.name, o.signature


def _generated(o) -> bool:
    return bool(getattr(o.kernel, "generated", False))


def replanned(planner: Planner, cost) -> Planner:
    """A planner for ``planner``'s graph and settings costed by ``cost`` (its options made
    again: they hold their estimates)."""
    return Planner(planner.outputs, target=planner.target, cost=cost,
                   tolerance=planner.tolerance, backends=planner.backends,
                   weights_on=planner.weights_on, blocks=False,
                   output_device=planner.output_device, dims=planner.dims,
                   generate=planner.generate, refused=planner.refused,
                   block_inputs=planner.block_inputs, stay=planner.stay,
                   streams=planner.streams)


def gated(o: Option, planner: Planner, outputs: frozenset | None = None) -> bool:
    """Whether ``o`` is measured only where a plan on optimistic times picks it (``could_win``)
    rather than with the first round: a generated kernel, or a host-side option of a plan for
    a GPU (``generated_cost.gated``: a host kernel, a copy between host and GPU), except a
    copy the plan needs whatever runs on the host: a fed leaf's to the GPU, an output's to
    the host when it is wanted there. ``outputs``: ``planner.output_slots`` (a property that
    builds its list on each read), when the caller asks for many options."""
    if _generated(o):
        return not MEASURE_EVERY_GENERATED
    if MEASURE_EVERY_HOST or not generated_cost.gated(o.kernel, planner.target):
        return False
    if o.how == COPY:
        if o.slot.device == planner.target:
            return not o.slot.node.op.is_leaf
        return o.slot not in (frozenset(planner.output_slots) if outputs is None else outputs)
    return True


def _open_keys(planner: Planner) -> set[tuple[str, str]]:
    """The (kernel, signature) of the planner's options that are not ``gated``: a call is
    measured with the first round if any option making it is."""
    outputs = frozenset(planner.output_slots)  # once, not once per copy option
    return {_key(o) for options in planner._options.values() for o in options
            if o.how in (KERNEL, COPY) and not gated(o, planner, outputs)}


def could_win(planner: Planner, unmeasured: Mapping[tuple[str, str], Option]
              ) -> set[tuple[str, str]]:
    """The calls of ``unmeasured`` (gated options by (kernel, signature)) in the plan made
    with every unmeasured gated kernel at its optimistic time (``generated_cost.Optimistic``:
    calibrated or roofline seconds over their uncertainty); the host-side options of a GPU
    plan only when ``unmeasured`` holds some (the first round offers generated kernels alone:
    the host's at their plain estimates). One left out cannot win even so; and since the
    plan's other steps are measured, a plan on the real estimates (each above its optimistic
    time) keeps them, so it picks no unmeasured gated option."""
    planner.cost.refresh()
    host = any(generated_cost.host_side(o.kernel, planner.target) for o in unmeasured.values())
    plan = replanned(planner, Optimistic(planner.cost, planner.target if host else None)).plan()
    return {_key(s) for s in plan.steps if _key(s) in unmeasured}


def profile_missing(planner: Planner, db: Database, progress: bool = True,
                    lease: float | None = None) -> int:
    """Measure and record what the planner's options miss, split with other profilers of the
    same file (see the module doc; ``lease`` defaults to ``LEASE_SECONDS``); on a read-only
    database into memory for this process, with a warning. Returns how many rows this process
    added.

    Every registered kernel's call is measured, except the host-side ones of a GPU plan; a
    gated option's (``gated``: a generated kernel, a host-side option of a GPU plan) only
    while an optimistic plan picks it (``could_win``), in rounds: first the generated kernels
    a plan on optimistic generated times picks, beside the registered kernels (in the graph's
    order, so a region is timed with the steps it competes with), then the options the next
    optimistic plan picks once those rows calibrate their generators' estimates
    (``db/generated_cost.py``) and the target's own options have rows, until it picks none.
    A host program whose weights exceed the
    cache (``Planner.streams``) also gets the memory's read bandwidth measured once per
    database and device (``bandwidth.ensure_read_rate``): its steps are costed at it."""
    # generated candidates this process builds measuring: verified once by the profilers of
    # this database (the compile's own builds are inside its ``sharing`` too: Pipeline.build)
    with shared_verify.sharing(db, planner.cost.hardware):
        return _profile(planner, db, progress, lease)


def _profile(planner: Planner, db: Database, progress: bool, lease: float | None) -> int:
    if planner.streams and planner.target == "cpu" and "cpu" in planner.cost.hardware:
        ensure_read_rate(db, planner.cost.hardware["cpu"])
    todo = calls_to_measure(planner)
    if not todo:
        return 0
    db.record_in_memory()  # a read-only database: keep the rows for this process's plans
    bar = Progress(len(todo), "profiling") if progress else None
    opened = _open_keys(planner)
    left = {_key(o): o for o in todo if _key(o) not in opened}
    first = {k: o for k, o in left.items() if _generated(o)}  # host-side: after the target's
    picks = could_win(planner, first) if first else set()
    batch = [o for o in todo if _key(o) not in left or _key(o) in picks]
    _verify_gpu_kernels_at_once(batch, planner.cost.hardware, shared_verify.scope_of(db),
                                progress)
    added = 0
    while batch:
        for window in Work(db, batch, lease, hardware=planner.cost.hardware):
            for o, m in window:
                db.record(m)
                added += 1
                if bar is not None:
                    bar.step(o.kernel.name)
        for o in batch:
            left.pop(_key(o), None)
        picks = could_win(planner, left) if left else set()
        batch = [o for o in left.values() if _key(o) in picks]
    if bar is not None:
        bar.close()
    return added
