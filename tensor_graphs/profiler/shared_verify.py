"""Verification outcomes shared by the profilers of one machine.

Each profiler verifies a kernel before it first times it, and its cache is its own process's
(``missing.verified``): four profilers splitting one graph met almost every kernel, so each
verified almost all of them (the block graph: 35 s of verification together for 4 s alone,
timed beside the window another profiler was timing). Here the first profiler to need a kernel
verifies it under a lock and files the outcome; the others wait for it and read it.

Outcomes are shared by the profilers of one database (its file or URL: ``scope_of``), so a
profile on a fresh database verifies afresh. An outcome is filed under a digest of that and of
everything verification depends on: the kernel's name, backend, device, source hash (and what
its function closes over), pattern, constraints (dtypes, ranks, contiguity, ``where``'s
source), tolerance, in-place/view/out declarations, prepared arguments and verification cases,
and the hardware key's device and libs layers (numpy, compiler versions). A kernel whose
description names a Python object only this process knows (a repr with an address) is not
shared. The folder is the private C library cache's (``files.private_dir``): an outcome
decides whether a kernel is timed and then used, so no other user may plant one.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from tensor_graphs.db.hardware import Hardware
from tensor_graphs.errors import UntrustedPathError
from tensor_graphs.files import check_trusted_file, private_dir
from tensor_graphs.kernels.registry import Kernel, source_hash

PATIENCE = 600.0  # seconds to wait for another profiler's verification before doing it here


def kernel_key(kernel, hw: Hardware, scope: str) -> str | None:
    """The digest ``kernel``'s outcome on ``hw`` for the profilers of ``scope`` (a database)
    is filed under, or None when its description holds an identity only this process knows,
    or it is not a registered kind of kernel (a generated candidate is verified as it is
    built, ``generated.realize``)."""
    if not isinstance(kernel, Kernel):
        return None
    cells = [c.cell_contents for c in getattr(kernel.fn, "__closure__", None) or ()
             if c.cell_contents is not None]
    extra = repr((cells, getattr(kernel.fn, "__defaults__", None)))
    where = getattr(kernel, "where", None)
    parts = [kernel.name, kernel.backend, kernel.device, kernel.source_hash,
             repr(kernel.pattern), repr(kernel.dtypes), repr(kernel.ranks),
             repr(kernel.contiguous), repr(kernel.tolerance), repr(kernel.inplace),
             repr(kernel.view), repr(kernel.writes_out), repr(sorted(kernel.prepare)),
             repr(kernel.signatures), "" if where is None else source_hash(where),
             extra, hw.device, hw.libs, scope]
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


def _read(path: Path) -> tuple[bool, str | None]:
    """(found, reason): reason None for a kernel that passed. A file another user could have
    written is not found (verified again and written over)."""
    try:
        check_trusted_file(path, "verification outcome")
        found = json.loads(path.read_text())
    except (OSError, ValueError, UntrustedPathError):
        return False, None
    if not isinstance(found, dict) or "reason" not in found:
        return False, None
    reason = found["reason"]
    return True, (reason if isinstance(reason, str) else None)


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
    ``PATIENCE`` seconds; then it is checked here too)."""
    key = None if scope is None else kernel_key(kernel, hw, scope)
    if key is None:
        return check()
    try:
        folder = _folder()
        fd = os.open(folder / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    except (OSError, UntrustedPathError):  # no private cache: verified here, not shared
        return check()
    path = folder / f"{key}.json"
    try:
        _lock(fd, PATIENCE)
        found, reason = _read(path)
        if found:
            return reason
        reason = check()
        tmp = path.with_name(f".{key}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"reason": reason, "when": time.time()}))
        os.replace(tmp, path)  # readers see no file or the whole outcome
        return reason
    finally:
        os.close(fd)
