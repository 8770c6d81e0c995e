"""Compile C source into a shared library, cache it on disk, load it with ctypes.

``load_library(name, source, extra_flags=())`` is the one entry point the C kernels and the
generated-C code generator use. It compiles with the system C compiler (``$CC``, else ``cc``,
else ``gcc``) using ``-O3 -march=native -fPIC -shared`` (+ ``-fopenmp`` when the compiler has
OpenMP). Never ``-ffast-math``: NaN and inf must propagate through every kernel.

The library is cached under ``$TG_CACHE_DIR/c`` (default ``~/.cache/tensor_graphs/c``, or
``$XDG_CACHE_HOME/tensor_graphs/c``) under a key that covers the source, the flags, the
compiler's version and the CPU (model and feature flags, since ``-march=native`` depends on
them). A compile writes to a temporary file in the same folder and ``os.replace``\\ s it into
place, so concurrent processes never load a half-written library; two processes that compile
the same source at once both succeed (the last rename wins, both files are identical).

A cached library is dlopen'ed, which runs its constructors, and its name is one anyone can
compute, so the cache must be a folder no other user can write: it is created 0700, and one
another user owns or could write (``files.private_dir``) is not used. Then the cache falls back
to ``<tmp>/tensor_graphs-<uid>/c`` (both levels private), and when that one is untrusted too
(another user created it first) to a fresh ``mkdtemp`` folder for this process, with one
warning naming the folder and why. Each file is checked again just before it is loaded
(``files.check_trusted_file``): one another user could have written is compiled over, never
loaded.

A failed compile raises ``CCompileError`` carrying the compiler's output. ``available()`` says
whether the C backend can be used at all (a compiler that builds and loads a trivial library),
and ``unavailable_reason()`` why not; the planner then uses other backends.

Sanitizer builds: ``TG_C_SANITIZE=address`` adds ``-fsanitize=address -fno-omit-frame-pointer
-g`` (and is part of the cache key). Loading such a library into CPython needs the ASan runtime
preloaded — see docs/ARCHITECTURE.md, "C backend".
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path

from tensor_graphs.errors import CCompileError, UntrustedPathError
from tensor_graphs.files import check_trusted_file, private_dir, untrusted_reason

# -fno-math-errno and -fno-trapping-math change no result (NaN and inf still propagate; only
# errno and FP exception flags are not kept) but let GCC vectorise selects and sqrt.
BASE_FLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-std=gnu11", "-fno-math-errno",
              "-fno-trapping-math")
SANITIZERS = {"address": ("-fsanitize=address", "-fno-omit-frame-pointer", "-g")}

_lock = threading.RLock()
_loaded: dict[str, ctypes.CDLL] = {}
_facts: dict[str, object] = {}
# counts, for tests and diagnostics: libraries compiled, found on disk, found in this process
stats = {"compiled": 0, "disk_hits": 0, "memory_hits": 0}


def configured_cache_dir() -> Path:
    """The folder the settings name: ``$TG_CACHE_DIR/c``, else the user cache's."""
    root = os.environ.get("TG_CACHE_DIR")
    if root:
        base = Path(root).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = (Path(xdg) if xdg else Path.home() / ".cache") / "tensor_graphs"
    return base / "c"


def cache_dir() -> Path:
    """The folder compiled libraries are kept in and loaded from: the configured one when only
    this user can write it, else a private fallback (see the module docstring), since whatever
    is found there is loaded as code."""
    path = configured_cache_dir()
    why = _refusal(path)
    if why is None:
        return path
    uid = os.getuid() if hasattr(os, "getuid") else 0
    shared = Path(tempfile.gettempdir()) / f"tensor_graphs-{uid}"
    why_shared = _refusal(shared, shared / "c")
    if why_shared is None:
        _warn_once(f"not using the C library cache {path}: {why}; libraries are kept in "
                   f"{shared / 'c'} instead ({_CACHE_FIX})")
        return shared / "c"
    with _lock:
        own = _facts.get("own_cache")
        if own is None:
            own = _facts["own_cache"] = Path(tempfile.mkdtemp(prefix=f"tensor_graphs-{uid}-"))
            atexit.register(shutil.rmtree, own, ignore_errors=True)
    _warn_once(f"not using the C library cache {path}: {why}; nor {shared / 'c'}: "
               f"{why_shared}; libraries are compiled into {own} for this process only "
               f"({_CACHE_FIX})")
    return own


_CACHE_FIX = "point TG_CACHE_DIR at a folder only you can write"


def _refusal(*folders: Path) -> str | None:
    """Why the last of these nested folders cannot hold the cache (each is created 0700 when
    missing), as a clause for the warning: the folder at fault is "it" when it is the last."""
    for folder in folders:
        subject = "it" if folder == folders[-1] else str(folder)
        try:
            private_dir(folder)
        except UntrustedPathError as exc:
            return untrusted_reason(folder, subject) or str(exc)
        except OSError as exc:
            return f"cannot create {subject}: {exc.strerror or exc}"
    if not os.access(folders[-1], os.W_OK | os.X_OK):
        return "it is not writable"
    return None


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    with _lock:
        if message in _warned:
            return
        _warned.add(message)
    warnings.warn(message, stacklevel=3)


def compiler() -> str | None:
    """The C compiler's path, or None when there is none."""
    for cand in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cand:
            found = shutil.which(cand)
            if found:
                return found
    return None


def compiler_version() -> str:
    """The compiler's ``--version`` output (part of the cache key)."""
    with _lock:
        cc = compiler()
        key = f"version:{cc}"
        if key not in _facts:
            try:
                out = subprocess.run([cc, "--version"], capture_output=True, text=True,
                                     timeout=60).stdout if cc else ""
            except (OSError, subprocess.SubprocessError):
                out = ""
            _facts[key] = f"{os.path.realpath(cc) if cc else None}\n{out.strip()}"
        return _facts[key]


def cpu_fingerprint() -> str:
    """The CPU's model and feature flags (``-march=native`` code depends on both)."""
    if "cpu" not in _facts:
        text = platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                info = f.read()
            first = info.split("\n\n")[0]
            keep = [ln for ln in first.splitlines()
                    if ln.split(":")[0].strip() in ("vendor_id", "cpu family", "model",
                                                    "model name", "flags", "Features",
                                                    "CPU implementer", "CPU part")]
            text += "\n" + "\n".join(keep)
        except OSError:
            text += "\n" + platform.processor()
        _facts["cpu"] = text
    return _facts["cpu"]


def sanitize_flags() -> tuple[str, ...]:
    """Flags asked for by ``TG_C_SANITIZE`` (empty when unset)."""
    which = os.environ.get("TG_C_SANITIZE", "").strip()
    if not which:
        return ()
    flags: list[str] = []
    for part in which.split(","):
        part = part.strip()
        flags.extend(SANITIZERS.get(part, (f"-fsanitize={part}",)))
    return tuple(flags)


def openmp_flags() -> tuple[str, ...]:
    """``("-fopenmp",)`` when the compiler builds and links OpenMP code, else ``()``."""
    with _lock:
        if "openmp" not in _facts:
            src = "#include <omp.h>\nint tg_omp_probe(void) { return omp_get_max_threads(); }\n"
            try:
                _compile_to(src, ("-fopenmp",), cache_dir() / "omp_probe_check.so", keep=False)
                _facts["openmp"] = ("-fopenmp",)
            except CCompileError:
                _facts["openmp"] = ()
        return _facts["openmp"]


def flags_for(extra_flags: Sequence[str] = ()) -> tuple[str, ...]:
    """The full flag list a library is compiled with (extra flags come after the source)."""
    return BASE_FLAGS + openmp_flags() + sanitize_flags() + tuple(extra_flags)


def cache_key(source: str, extra_flags: Sequence[str] = ()) -> str:
    h = hashlib.blake2b(digest_size=12)
    for part in (source, "\0".join(flags_for(extra_flags)), compiler_version(),
                 cpu_fingerprint(), "v1"):
        h.update(part.encode())
        h.update(b"\x01")
    return h.hexdigest()


def library_path(name: str, source: str, extra_flags: Sequence[str] = ()) -> Path:
    """Where the library for this source and these flags is (or would be) cached."""
    safe = "".join(c if c.isalnum() or c in "_-" else "_" for c in name)[:60] or "lib"
    return cache_dir() / f"{safe}-{cache_key(source, extra_flags)}.so"


def load_library(name: str, source: str, extra_flags: Sequence[str] = ()) -> ctypes.CDLL:
    """Compile ``source`` (unless cached) and load it. Raises ``CCompileError`` on failure."""
    if compiler() is None:
        raise CCompileError(f"cannot compile C library '{name}': no C compiler found "
                            f"(set $CC, or install gcc)")
    path = library_path(name, source, extra_flags)
    key = str(path)
    with _lock:
        lib = _loaded.get(key)
        if lib is not None:
            stats["memory_hits"] += 1
            return lib
        fresh = not path.exists()
        if not fresh:
            try:
                check_trusted_file(path, "compiled C library")
            except UntrustedPathError as exc:
                _warn_once(f"{exc} Compiling it again in its place.")
                fresh = True
        if fresh:
            with _building(path):
                if path.exists() and not untrusted_reason(path):
                    stats["disk_hits"] += 1  # another process built it while we waited
                else:
                    _compile_to(source, tuple(openmp_flags()) + sanitize_flags(), path,
                                extra_flags=tuple(extra_flags), name=name)
                    stats["compiled"] += 1
        else:
            stats["disk_hits"] += 1
        try:
            lib = _dlopen(path, name)
        except CCompileError as exc:
            if fresh:
                raise
            # a cached file cut short (a crash before the data reached the disk) or
            # overwritten: compiled over, or the backend stays unusable until it is deleted
            _warn_once(f"cached C library {path} does not load ({exc.output}); compiling it "
                       "again in its place")
            with _building(path):
                _compile_to(source, tuple(openmp_flags()) + sanitize_flags(), path,
                            extra_flags=tuple(extra_flags), name=name)
                stats["compiled"] += 1
            lib = _dlopen(path, name)
        lib._tg_path = str(path)  # noqa: SLF001 - for diagnostics
        _loaded[key] = lib
        return lib


def _dlopen(path: Path, name: str) -> ctypes.CDLL:
    """``path`` loaded, checked first: never a file another user could have written (its
    constructors run on load); in a private folder, nobody else can swap it after the check.
    A file that does not load is a ``CCompileError`` carrying the loader's message."""
    check_trusted_file(path, "compiled C library")
    try:
        return ctypes.CDLL(str(path))
    except OSError as e:
        hint = ""
        if sanitize_flags():
            hint = (" (a sanitizer build needs its runtime preloaded: "
                    "LD_PRELOAD=$(cc -print-file-name=libasan.so))")
        raise CCompileError(f"compiled C library '{name}' but could not load it: {e}{hint}",
                            output=str(e)) from None


@contextlib.contextmanager
def _building(path: Path):
    """Holds ``path``'s build lock (an ``flock`` on a ``.lock`` file beside it): processes
    sharing the cache that need the same library build it once, the others wait and load
    it (four profilers starting together compiled each library four times). The lock dies
    with its holder, so a killed build leaves no lock behind."""
    lock = path.with_name(path.name + ".lock")
    with _writing(path.parent, path.name):
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock


@contextlib.contextmanager
def _writing(folder: Path, name: str):
    """An ``OSError`` met writing into the cache (a full disk, a folder made read-only since)
    as a ``CCompileError`` naming the folder and the fix: the planner then uses other
    backends and refuses generated C kernels, where a bare ``OSError: [Errno 28] No space
    left on device`` ended ``tg.compile``."""
    try:
        yield
    except OSError as exc:
        raise CCompileError(f"cannot build C library '{name}' in {folder}: "
                            f"{exc.strerror or exc}; free space there, or {_CACHE_FIX}",
                            output=str(exc)) from None


def _compile_to(source: str, mode_flags: tuple[str, ...], dest: Path, *,
                extra_flags: tuple[str, ...] = (), name: str = "probe", keep: bool = True) -> None:
    cc = compiler()
    if cc is None:
        raise CCompileError("no C compiler found (set $CC, or install gcc)")
    folder = dest.parent
    with _writing(folder, name):
        fd, src_path = tempfile.mkstemp(prefix=f".{dest.stem}.", suffix=".c", dir=folder)
        tmp_out = src_path[:-2] + ".so.tmp"
        try:
            with os.fdopen(fd, "w") as f:
                f.write(source)
            cmd = [cc, *BASE_FLAGS, *mode_flags, src_path, "-o", tmp_out, *extra_flags, "-lm"]
            try:
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            except (OSError, subprocess.SubprocessError) as e:
                raise CCompileError(f"could not run the C compiler for '{name}': {e}",
                                    output=str(e), command=tuple(cmd)) from None
            if res.returncode != 0:
                output = (res.stdout + res.stderr).strip()
                tail = output if len(output) < 4000 else output[:1500] + "\n...\n" + output[-2500:]
                raise CCompileError(f"C compiler failed on '{name}' (exit {res.returncode}):\n"
                                    f"{' '.join(cmd)}\n{tail}", output=output, command=tuple(cmd))
            if keep:
                os.chmod(tmp_out, 0o755)  # the compiler's mode follows the umask (0777 under 000)
                _sync(tmp_out)  # else a crash soon after can leave the renamed file empty
                os.replace(tmp_out, dest)  # atomic: readers see the old file or the whole new one
        finally:
            for p in (src_path, tmp_out):
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass


def _sync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_PROBE = "int tg_c_probe(int x) { return x + 1; }\n"


def available() -> bool:
    """True when the C backend can be used: a compiler builds and loads a trivial library."""
    return unavailable_reason() is None


def unavailable_reason() -> str | None:
    """Why the C backend cannot be used, or None when it can (probed once per process)."""
    with _lock:
        if "reason" not in _facts:
            try:
                lib = load_library("tg_probe", _PROBE)
                lib.tg_c_probe.restype = ctypes.c_int
                lib.tg_c_probe.argtypes = [ctypes.c_int]
                ok = lib.tg_c_probe(41) == 42
                _facts["reason"] = None if ok else "the probe library returned a wrong value"
            except CCompileError as e:
                _facts["reason"] = str(e)
            except OSError as e:
                _facts["reason"] = f"cannot write the C library cache: {e}"
        return _facts["reason"]


def mark_unavailable(reason: str) -> None:
    """Record that the C backend is unusable (e.g. its own kernels failed to build)."""
    with _lock:
        _facts["reason"] = reason
