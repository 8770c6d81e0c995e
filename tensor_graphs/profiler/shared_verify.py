"""Verification outcomes shared by the profilers of one machine.

Each profiler verifies a kernel before it first times it, and its cache is its own process's
(``missing.verified``): four profilers splitting one graph met almost every kernel, so each
verified almost all of them (the block graph: 35 s of verification together for 4 s alone,
timed beside the window another profiler was timing). Here the first profiler to need a kernel
verifies it under a lock and files the outcome; the others wait for it and read it. Before a
profile times anything, ``verify_at_once`` files its GPU kernels' outcomes from worker
processes together, where the cores allow (see the note above it).

Outcomes are shared by the profilers of one database (its file or URL: ``scope_of``), so a
profile on a fresh database verifies afresh. An outcome is filed under a digest of that and of
everything verification depends on: the kernel's name, backend, device, source hash (and what
its function closes over), pattern, constraints (dtypes, ranks, contiguity, ``where``'s
source), tolerance, in-place/view/out declarations, prepared arguments and verification cases,
the hardware key's device and libs layers (numpy, compiler versions), and the verifier
itself (``verifier_digest``: the source of the checks, the reference, the renderers'
admission), so a check added since an outcome was filed verifies afresh. A kernel whose
description names a Python object only this process knows (a repr with an address) is not
shared. The folder is the private C library cache's (``files.private_dir``): an outcome
decides whether a kernel is timed and then used, so no other user may plant one.

Generated candidates (``kernels/generated``) are verified as they are built (``realize``:
compiled, checked by their renderer, then ``tg.kernels.verify``), by whichever process first
needs one: a profiler measuring it, or any profiler's compile whose plan picks it. Inside
``with sharing(db, hardware)`` (a profiling compile's profiling and its own kernel builds;
``profile_missing``'s measuring), ``realize`` of the profilers of one database goes through
here, in that thread only; outside it a candidate is verified by its process (a later compile
against another database must not read this one's outcomes). The first builds and
verifies the candidate and files the outcome with the tolerance its checks declared; the
others take its unchecked build (``Candidate.draft``, the compiled library shared on disk)
with that tolerance, or refuse it with the first one's reason. A candidate's outcome is filed
under its generator, name, source hash, backend and device, declared tolerance, prepared
arguments, layout, the shapes and dtypes of the values it reads and writes (its checks run on
them), the hardware key's device and libs (the compiler's version among them) and the
verifier's digest. A compile error is no outcome (it may be this machine's): it is not filed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import inspect
import json
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from tensor_graphs.db.cost import measured_on
from tensor_graphs.db.hardware import Hardware, current
from tensor_graphs.devices import gpu_fault
from tensor_graphs.errors import (
    KernelVerificationError,
    TensorGraphsError,
    UntrustedPathError,
)
from tensor_graphs.files import atomic_write, check_trusted_file, private_dir
from tensor_graphs.kernels import generated
from tensor_graphs.kernels.registry import Kernel, source_hash

PATIENCE = 600.0  # seconds to wait for another profiler's verification before doing it here


# What a verdict depends on besides the kernel, as source files under the package (a folder:
# its .py files): an outcome is keyed by their digest (``verifier_digest``), so a check added
# or changed files outcomes afresh; a "passed" filed before it is never reused, which would
# hand other processes the kernel's unchecked ``draft``
VERIFIER_SOURCES = (
    "kernels/verify.py",  # tg.kernels.verify: its cases (the gelu 'tail'), comparison, bounds
    "kernels/adversarial.py",  # the adversarial inputs derived from a pattern's ops
    "kernels/signatures.py",  # the cases' specs: shapes, dtypes, layouts drawn
    "numerics.py",  # the one error measure, ||got - ref|| / ||ref||
    "ir/evaluate.py",  # evaluates the float64 reference
    "kernels/numpy",  # the reference's kernels (each op's float64 formula)
    "kernels/c/codegen.py",  # the elementwise renderer's check and the admission (admitted)
    "kernels/c/rowgen.py",  # the row renderer's check
    "kernels/c/gemm_epilogue.py",  # the GEMM epilogue renderer's check
    "kernels/triton/check.py",  # the Triton renderers' check
    "kernels/triton/generate.py",  # the Triton admission around it
)


@functools.cache
def verifier_digest() -> str:
    """A digest of ``VERIFIER_SOURCES``' text, read once per process (a process runs the
    checks it loaded: a file edited while it runs is the next process's)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.blake2b(digest_size=16)
    for entry in VERIFIER_SOURCES:
        path = root / entry
        files = sorted(path.glob("*.py")) if path.is_dir() else [path]
        for f in files:
            h.update(f"{entry}/{f.name}".encode() + b"\0")
            try:
                h.update(f.read_bytes())
            except OSError:  # not installed as files: the entry's name stands for it
                h.update(b"unreadable")
            h.update(b"\0")
    return h.hexdigest()


def kernel_key(kernel, hw: Hardware, scope: str) -> str | None:
    """The digest ``kernel``'s outcome on ``hw`` for the profilers of ``scope`` (a database)
    is filed under, or None when its description holds an identity only this process knows,
    or it is not a registered kind of kernel (a generated candidate's is ``candidate_key``)."""
    if not isinstance(kernel, Kernel):
        return None
    cells = [c.cell_contents for c in getattr(kernel.fn, "__closure__", None) or ()
             if c.cell_contents is not None]
    extra = _described((cells, getattr(kernel.fn, "__defaults__", None)))
    where = getattr(kernel, "where", None)
    cases = _cases(kernel.signatures)
    if cases is None:
        return None
    parts = [kernel.name, kernel.backend, kernel.device, kernel.source_hash,
             _described(kernel.pattern), repr(kernel.dtypes), repr(kernel.ranks),
             repr(kernel.contiguous), repr(kernel.tolerance), repr(kernel.inplace),
             repr(kernel.view), repr(kernel.writes_out), repr(sorted(kernel.prepare)),
             cases, "" if where is None else source_hash(where),
             extra, hw.device, hw.libs, scope, verifier_digest()]
    return _digest(parts)


def _described(value) -> str:
    """``value`` (a kernel's pattern, what its function closes over, its defaults) as text
    that names the same thing in every process: a function by its module, name and source (a
    Triton template's launcher, the numpy formula a kernel wraps, a pattern's attribute
    predicate), where its repr would hold its address and so keep the kernel from being
    shared; containers and dataclasses item by item."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ", ".join(f"{f.name}={_described(getattr(value, f.name))}"
                           for f in dataclasses.fields(value))
        return f"{type(value).__name__}({fields})"
    if isinstance(value, (list, tuple)):
        return f"({', '.join(map(_described, value))})"
    if isinstance(value, dict):
        return f"{{{', '.join(f'{_described(k)}: {_described(v)}' for k, v in value.items())}}}"
    if isinstance(value, (set, frozenset)):  # sorted: a set's order varies with the process
        return f"{{{', '.join(sorted(map(_described, value)))}}}"
    if inspect.isfunction(value):
        return f"{value.__module__}.{value.__qualname__}:{source_hash(value)}"
    if inspect.isbuiltin(value):  # (torch's functions: "<built-in method sin of ... at 0x")
        return f"{value.__module__ or ''}.{getattr(value, '__qualname__', value.__name__)}"
    return repr(value)


def _cases(signatures) -> str | None:
    """The verification cases a kernel's ``signatures=`` gives, as text: a function of them
    (every Triton template's, which depend on its config and on the interpreter) by the
    cases it returns, since its repr holds its address, which kept every Triton kernel out
    of the workers (``verify_at_once``): GPT-2's first GPU profile then verified its GEMM
    and attention templates one after another, 25-38 s each on an H200."""
    if callable(signatures):
        try:
            return repr(signatures())
        except Exception:  # noqa: BLE001 - the kernel's checks report it; nothing is shared
            return None
    return repr(signatures)


def candidate_key(cand: generated.Candidate, hw: Hardware, scope: str) -> str | None:
    """The digest a generated candidate's outcome on ``hw`` for the profilers of ``scope`` is
    filed under (see the module doc), or None when it has no ``draft`` to share it with."""
    if cand.draft is None:
        return None
    values = (*cand.inputs, cand.root, *cand.also)
    parts = ["generated", cand.generator, cand.name, cand.source_hash, cand.backend,
             cand.device, repr(cand.tolerance), repr(cand.prepared), repr(cand.contiguous),
             repr(cand.view),
             *(f"{[str(d) for d in n.shape]}:{getattr(n.dtype, 'name', n.dtype)}"
               for n in values), hw.device, hw.libs, scope, verifier_digest()]
    return _digest(parts)


def _digest(parts: list[str]) -> str | None:
    text = "\0".join(parts)
    if " at 0x" in text:
        return None
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


KEEP_SECONDS = 86400.0  # outcomes (and their locks) older than this are removed
_pruned: set[Path] = set()


def _folder() -> Path:
    """The private folder, pruned once per process of what is older than ``KEEP_SECONDS``
    (every fresh database, each test's included, files its own outcomes: they would pile up).
    A profile running longer than that at worst verifies a kernel once more."""
    from tensor_graphs.kernels.c.build import cache_dir

    folder = private_dir(cache_dir() / "verified")
    if folder not in _pruned:
        _pruned.add(folder)
        old = time.time() - KEEP_SECONDS
        for entry in os.scandir(folder):
            try:
                if entry.stat(follow_symlinks=False).st_mtime < old:
                    os.unlink(entry.path)
            except OSError:
                pass
    return folder


def _read(path: Path) -> dict | None:
    """The outcome filed at ``path`` ({"reason": None for a kernel that passed, else why
    not, ...}), or None. A file another user could have written is not found (verified again
    and written over)."""
    try:
        check_trusted_file(path, "verification outcome")
        found = json.loads(path.read_text())
    except (OSError, ValueError, UntrustedPathError):
        return None
    if not isinstance(found, dict) or "reason" not in found:
        return None
    if not isinstance(found["reason"], str):
        found["reason"] = None
    return found


def scope_of(db) -> str | None:
    """Which profilers share outcomes: those of one database (its file, by path and inode, or
    its URL); None for a private one (in memory)."""
    path = str(getattr(db, "path", "") or "")
    if not path or path == ":memory:":
        return None
    if "://" in path:
        return path
    try:
        return f"{os.path.realpath(path)}\0{os.stat(path).st_ino}"
    except OSError:
        return None


def _lock(fd: int, patience: float) -> bool:
    """Takes the ``flock`` on ``fd``, polled so that a holder stopped (not dead: a dead one's
    lock dies with it) is waited for ``patience`` seconds only; False when it gave up."""
    give_up = time.monotonic() + patience
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > give_up:
                return False
            time.sleep(0.01)


def shared(kernel, hw: Hardware, check: Callable[[], str | None],
           scope: str | None) -> str | None:
    """``check()`` (None when ``kernel`` passes, else why not), run once for the kernel's key
    by the profilers of this machine sharing ``scope`` (``scope_of``; None: not shared):
    another profiler's outcome is read, and one verifying it now is waited for (up to
    ``PATIENCE`` seconds; then it is checked here too). A generated candidate is realized
    instead (``generated.realize``, which verifies it, shared inside ``sharing``)."""
    if isinstance(kernel, generated.Candidate) and kernel.draft is not None:
        try:
            generated.realize(kernel)
            return None
        except Exception as exc:  # noqa: BLE001 - a broken kernel is recorded, not fatal
            return _reason(exc, kernel)
    key = None if scope is None else kernel_key(kernel, hw, scope)
    if key is None:
        return check()
    return _filed(key, lambda: {"reason": check()})["reason"]


def check(kernel) -> str | None:
    """``tg.kernels.verify`` on ``kernel`` (a generated one built first): None when it
    passes, else why not (an exception is a reason, not an error: a broken kernel is
    recorded)."""
    from tensor_graphs.kernels.verify import verify

    try:
        report = verify(generated.realize(kernel))
        return None if report.ok else report.summary()
    except Exception as exc:  # noqa: BLE001 - a broken kernel is recorded, not fatal
        return _reason(exc, kernel)


def _reason(exc: Exception, kernel) -> str:
    """Why ``kernel`` is refused, from what it raised; a GPU fault is raised instead, never
    filed (``devices.gpu_fault``: no kernel's own, and an outcome is kept for good)."""
    fault = gpu_fault(exc, f"verifying kernel {kernel.name}")
    if fault is not None:
        raise fault from exc
    return f"{type(exc).__name__}: {exc}"


# Verification at once, before a profile times anything: on a GPU each Triton kernel's checks
# compile it once per specialization they meet (~10 for a GEMM template config: shapes,
# dtypes, layouts), so GPT-2 124M's first profile on an H100 spent ~220 of its 266 s verifying
# fifteen fp32 GEMM configs one after another while 15 of the host's 16 cores idled. Worker
# processes (fresh interpreters: a forked CUDA context is unusable) each verify kernels and
# file the outcomes as ``shared`` does; the profile reads them, and verifies itself whatever
# they did not file. One worker per PARALLEL_CORES cores, at most PARALLEL_WORKERS; none on a
# machine with fewer than two to give (the kernels' own thread teams use those cores).
PARALLEL_CORES = 2
PARALLEL_WORKERS = 8


def workers_for(kernels: int) -> int:
    """How many worker processes verify ``kernels`` kernels at once here (0: none)."""
    from tensor_graphs.threads import cores

    n = min(kernels, cores() // PARALLEL_CORES, PARALLEL_WORKERS)
    return n if n >= 2 else 0


def verify_at_once(kernels, hardware_of: Callable[[object], Hardware], scope: str | None,
                   workers: int | None = None, progress: bool = False) -> int:
    """File the outcomes of ``kernels`` (registered kernels, each verified as ``shared``
    does for the profilers of ``scope``) from ``workers`` processes at once (default
    ``workers_for``); returns how many outcomes they filed. Nothing happens without a shared
    scope (an in-memory database shares nothing), with fewer than two workers, or for a
    kernel another process cannot find by name (registered by this program alone) or whose
    description is this process's alone (no key). A worker that dies loses only its own
    kernels' outcomes: the profile verifies those itself."""
    if scope is None:
        return 0
    todo = []
    for k in kernels:
        hw = hardware_of(k)
        if isinstance(k, Kernel) and not getattr(k, "generated", False) \
                and kernel_key(k, hw, scope) is not None:
            todo.append((k.name, k.source_hash, hw))
    n = workers_for(len(todo)) if workers is None else min(workers, len(todo))
    if n < 2:
        return 0
    from tensor_graphs.progress import Progress

    procs = [_start_worker([job for j, job in enumerate(todo) if j % n == w], scope)
             for w in range(n)]
    filed = 0
    bar = Progress(n, f"verifying {len(todo)} GPU kernels in {n} processes") \
        if progress else None
    try:
        for proc in procs:
            out, _ = proc.communicate()
            filed += sum(line == "filed" for line in out.splitlines())
            if bar is not None:
                bar.step()
    finally:
        for proc in procs:  # (an interrupt: no worker outlives the profile)
            if proc.poll() is None:
                proc.kill()
        if bar is not None:
            bar.close()
    return filed


def _start_worker(jobs: list[tuple[str, str, Hardware]], scope: str):
    """A worker process verifying ``jobs`` (name, source hash, hardware key): a fresh
    interpreter running ``worker``, the jobs as JSON in its argument. Not
    multiprocessing's spawn, which imports the caller's ``__main__`` again in each worker: a
    user's script without a ``__name__`` guard would run whole, eight times over, before its
    workers verified anything."""
    import subprocess
    import sys

    # this copy of the package, found first only where the worker's own path lacks its
    # folder (a source checkout): an installed one's folder, site-packages, put ahead of the
    # standard library through PYTHONPATH could shadow it
    package = str(Path(__file__).resolve().parents[2])
    code = (f"import sys\nif {package!r} not in sys.path: sys.path.insert(0, {package!r})\n"
            "from tensor_graphs.profiler.shared_verify import worker\nworker()")
    task = json.dumps({"scope": scope, "jobs": [[name, digest, dataclasses.astuple(hw)]
                                                for name, digest, hw in jobs]})
    return subprocess.Popen([sys.executable, "-c", code, task], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def worker() -> None:
    """A verification worker's body (``_start_worker``): each job's registered kernel
    verified and its outcome filed, "filed" printed for each; a kernel this process does not
    have (registered by the parent's program alone, or another version of it) is skipped."""
    import sys

    from tensor_graphs.kernels import registry

    task = json.loads(sys.argv[1])
    for name, digest, hw in task["jobs"]:
        try:
            kernel = registry.get(name)
        except Exception:  # noqa: BLE001 - registered by the parent's program alone
            continue
        if kernel.source_hash != digest:
            continue
        shared(kernel, Hardware(*hw), lambda k=kernel: check(k), task["scope"])
        print("filed", flush=True)


def _file(path, outcome: dict) -> None:
    """Write ``outcome`` where other profilers read it (atomically: they see no file or the
    whole outcome), or nothing: a full disk or a folder made read-only raised a bare OSError
    out of the profile and left its temporary file behind; the outcome is this process's
    either way, only not shared."""
    try:
        with atomic_write(path, what="verification outcome", only_owner_writes=True) as f:
            f.write(json.dumps({**outcome, "when": time.time()}))
    except (OSError, TensorGraphsError):
        pass


def _filed(key: str, make: Callable[[], dict]) -> dict:
    """The outcome filed under ``key``, else ``make()``'s, filed: under the key's lock, so
    one process makes it and the others wait for it (``PATIENCE``). Not shared (made here)
    where the private folder is unusable."""
    try:
        folder = _folder()
        fd = os.open(folder / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    except (OSError, UntrustedPathError):  # no private cache: verified here, not shared
        return make()
    path = folder / f"{key}.json"
    try:
        _lock(fd, PATIENCE)
        found = _read(path)
        if found is not None:
            return found
        outcome = make()
        _file(path, outcome)
        return outcome
    finally:
        os.close(fd)


@contextlib.contextmanager
def sharing(db, hardware: Mapping[str, Hardware] | None = None) -> Iterator[None]:
    """Inside the block (this thread), generated candidates this process realizes are
    verified once by the profilers of ``db`` (``scope_of``; a private database shares
    nothing), each keyed by its device kind's hardware key in ``hardware`` (the cost model's,
    as the profiler's rows). A profiling compile holds it around its profiling and its own
    kernel builds (``compiler.Pipeline.build``), ``profile_missing`` around its measuring;
    after the block a compile against another database verifies for itself again."""
    scope = scope_of(db)
    with generated.sharing(None if scope is None else
                           functools.partial(_build, scope=scope,
                                             hardware=dict(hardware or {}))):
        yield


def _build(cand: generated.Candidate, scope: str, hardware: Mapping[str, Hardware]):
    """``cand`` built and verified here, or its ``draft`` with the tolerance another
    profiler's checks declared; ``KernelVerificationError`` where they refused it. A compile
    error propagates unfiled (``CCompileError``: it may be this machine's compiler)."""
    kind = measured_on(cand)
    key = candidate_key(cand, hardware.get(kind) or current(kind), scope)
    if key is None:
        return cand.build()
    built, refused = [], []  # what make() did here, if it ran

    def make() -> dict:
        try:
            built.append(cand.build())
        except KernelVerificationError as exc:
            refused.append(exc)
            return {"reason": str(exc)}
        return {"reason": None, "tolerance": float(built[0].tolerance)}

    outcome = _filed(key, make)
    if built:
        return built[0]
    if refused:
        raise refused[0]
    if outcome["reason"] is not None:
        raise KernelVerificationError(outcome["reason"])
    tolerance = outcome.get("tolerance")
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) \
            or not math.isfinite(tolerance):
        return cand.build()  # an outcome without a usable tolerance: verified here
    return dataclasses.replace(cand.draft(), tolerance=float(tolerance))
