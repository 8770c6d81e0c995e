"""Writing files so that a reader never sees half of one."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from tensor_graphs.errors import UntrustedPathError


@contextmanager
def atomic_write(path, mode: str = "w") -> Iterator[IO]:
    """Write to a temporary file next to ``path``, then rename it over ``path`` (readers see the
    old file or the whole new one; a failure leaves no temporary file behind)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".",
                               suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# Who may have written a path we load code or plans from: this user, or root (a system-wide
# install). Anyone else could have planted what we would run.
_TRUSTED_OWNERS = frozenset({os.getuid(), 0}) if hasattr(os, "getuid") else frozenset()


def untrusted_reason(path) -> str | None:
    """Why ``path`` (a file or a folder) may hold what another local user wrote, or None when
    only this user (or root) can have written it: owned by another user, or writable by group or
    others. A symbolic link is judged by both the link and what it points to."""
    if not hasattr(os, "getuid"):  # no POSIX owners (Windows): nothing to compare
        return None
    path = os.fspath(path)
    for follow in (False, True):
        st = os.stat(path, follow_symlinks=follow)
        what = "the link" if not follow and os.path.islink(path) else "it"
        if st.st_uid not in _TRUSTED_OWNERS:
            return f"{what} is owned by uid {st.st_uid}, not by you (uid {os.getuid()})"
        if follow and st.st_mode & 0o022:
            who = " and ".join(w for bit, w in ((0o020, "group"), (0o002, "others"))
                               if st.st_mode & bit)
            return f"{what} is writable by {who} (mode {st.st_mode & 0o777:o})"
    return None


def private_dir(path) -> Path:
    """Create ``path`` (and missing parents) readable and writable by this user only (0700), and
    check that an existing one is trusted. Raises ``UntrustedPathError`` naming the folder and
    the fix when another user could write into it, since what we keep there is loaded as code."""
    path = Path(path)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    why = untrusted_reason(path)
    if why:
        raise UntrustedPathError(
            f"refusing to use folder {path}: {why}, so another user could place files there "
            f"that tensor_graphs would load. Use a folder only you can write (chmod 700 "
            f"{path}, or point the setting at another folder).")
    return path


def check_trusted_file(path, what: str) -> None:
    """Raise ``UntrustedPathError`` unless ``path`` and its folder can only have been written by
    this user (or root); ``what`` names the file's role in the message ("plan file")."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    # in a sticky folder (/tmp) others may write, but not replace or delete a file of ours
    sticky = bool(os.stat(folder).st_mode & stat.S_ISVTX)
    for target in (path,) if sticky else (path, folder):
        why = untrusted_reason(target)
        if why:
            place = "it" if target == path else f"its folder {target}"
            raise UntrustedPathError(
                f"refusing to load {what} {path}: {why.replace('it ', place + ' ', 1)}, so "
                f"another user could have changed it. Make it writable only by you (chmod "
                f"go-w) or copy it to a folder only you can write.")
