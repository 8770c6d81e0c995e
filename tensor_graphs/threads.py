"""One thread count for every pool in the process: OpenBLAS, OpenMP and torch.

    import tensor_graphs.threads as threads
    threads.set_num_threads(2)      # or TG_NUM_THREADS=2 in the environment
    threads.get_num_threads()

The default is ``$TG_NUM_THREADS``, else the number of cores this process may run on. Setting
it sets, together: the OpenBLAS of ``scipy-openblas32`` (the BLAS of the C backend) and any
other OpenBLAS already loaded (numpy's own), OpenMP (libgomp's ``omp_set_num_threads`` for the
calling thread, and every C-backend library's own count, used by its ``num_threads`` clauses
so it holds on any calling thread), and torch (``torch.set_num_threads``) when torch has been
imported. Each pool then uses n threads and they run one after another, so on 2 cores nothing
oversubscribes. Import torch before calling ``set_num_threads`` (or call it again after) for
torch to follow.

Pools that take turns must also stop spinning soon after their turn, or an idle pool's
busy-waiting threads steal the cores from the next one (measured on 2 cores: a layer_norm right
after an sgemm took 3.5 ms instead of 0.2 ms; GPT-2 2-layer prefill 192 ms instead of 86 ms).
Importing this module therefore sets, unless already set, ``OPENBLAS_THREAD_TIMEOUT=4``
(OpenBLAS workers sleep almost at once) and ``GOMP_SPINCOUNT=10000`` (libgomp workers spin
~0.1 ms, then sleep). Not shorter: a worker that sleeps between two of our calls is woken
through the hypervisor, and on this 2-vCPU VM that left it out of the next calls for ~50 ms
after any idle spell (a (128x768) @ (768x2304) GEMM after a 0.25 s pause: 4.6 ms for the
first dozen calls at GOMP_SPINCOUNT=1000, 2.2 ms from the first at 10000; GPT-2 2-layer's
first prefill after 1 s idle: 71-91 ms against 67-71), while a torch op right after our GEMM
measured the same at 1000 and 10000. Both are read when those libraries load, so ``import
tensor_graphs`` imports this module before anything loads numpy; numpy or torch imported
*before* tensor_graphs keep spinning pools, and the import warns once naming them (``late_pools``).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import warnings

from tensor_graphs.errors import ArgumentError

SPIN_SETTINGS = {"OPENBLAS_THREAD_TIMEOUT": "4", "GOMP_SPINCOUNT": "10000"}
# pools already loaded without these settings: (module that loaded it, its pool, the variable)
_LATE = (("numpy", "numpy's OpenBLAS", "OPENBLAS_THREAD_TIMEOUT"),
         ("torch", "torch's OpenMP", "GOMP_SPINCOUNT"))
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
        RuntimeWarning, stacklevel=2)

_lock = threading.RLock()
_count: int | None = None
_libraries: list = []  # C-backend libraries exporting tg_set_threads(int)


def cores() -> int:
    """How many cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _from_env() -> int:
    raw = os.environ.get("TG_NUM_THREADS", "").strip()
    if not raw:
        return cores()
    try:
        n = int(raw)
    except ValueError:
        raise ArgumentError(f"TG_NUM_THREADS must be a positive integer, got {raw!r}") from None
    if n < 1:
        raise ArgumentError(f"TG_NUM_THREADS must be a positive integer, got {raw!r}")
    return n


def get_num_threads() -> int:
    """The thread count every pool uses (``$TG_NUM_THREADS`` or the core count by default)."""
    with _lock:
        if _count is None:
            set_num_threads(_from_env())
        return _count


def set_num_threads(n: int) -> None:
    """Use ``n`` threads in OpenBLAS, OpenMP (our C libraries) and torch, together."""
    global _count
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ArgumentError(f"set_num_threads: need a positive integer, got {n!r}")
    with _lock:
        _count = n
        _set_openblas(n)
        _set_openmp(n)
        for lib in _libraries:
            lib.tg_set_threads(n)
        torch = sys.modules.get("torch")
        if torch is not None and hasattr(torch, "set_num_threads"):
            try:
                torch.set_num_threads(n)
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
        _libraries.append(lib)
        fn(get_num_threads())


_SETTERS = ("scipy_openblas_set_num_threads", "scipy_openblas_set_num_threads64_",
            "openblas_set_num_threads", "openblas_set_num_threads64_")


def _openblas_paths() -> list[str]:
    paths = []
    try:
        import scipy_openblas32

        lib_dir = scipy_openblas32.get_lib_dir()
        paths.append(os.path.join(lib_dir, f"lib{scipy_openblas32.get_library()}.so"))
    except ImportError:
        pass
    try:  # OpenBLAS builds already in the process (numpy's bundled one)
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rsplit(None, 1)[-1] if "/" in line else ""
                if "openblas" in os.path.basename(path).lower() and path not in paths:
                    paths.append(path)
    except OSError:
        pass
    return paths


def _set_openblas(n: int) -> None:
    for path in _openblas_paths():
        if not os.path.exists(path):
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _SETTERS:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.argtypes = [ctypes.c_int]
                fn.restype = None
                fn(n)
                break


def _set_openmp(n: int) -> None:
    for name in ("libgomp.so.1", "libomp.so", "libiomp5.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        fn = getattr(lib, "omp_set_num_threads", None)
        if fn is not None:
            fn.argtypes = [ctypes.c_int]
            fn.restype = None
            fn(n)
        return


def openblas_num_threads() -> int | None:
    """The thread count scipy-openblas32 reports (for checks), or None without it."""
    for path in _openblas_paths()[:1]:
        try:
            lib = ctypes.CDLL(path)
            fn = lib.scipy_openblas_get_num_threads
            fn.restype = ctypes.c_int
            return int(fn())
        except (OSError, AttributeError):
            return None
    return None
