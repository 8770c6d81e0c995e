"""The one owner of how tensor_graphs touches files: writing so that a reader never sees half of
one, with the mode open() would give or the replaced file's (``atomic_write``), reading a file
it will parse (``open_regular``, ``read_regular``, ``parse_json``: only regular files, every
failure one error naming the file and the fix), and who may have written what it loads code or
plans from (``untrusted_reason`` and its users)."""

from __future__ import annotations

import json
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, BinaryIO

from tensor_graphs.errors import (
    ArgumentError,
    SerializationError,
    TensorGraphsError,
    UntrustedPathError,
)

#: how a reader reports a refused file: an exception class taking the message
Refusal = Callable[[str], Exception]


def _umask() -> int:
    """This process's umask. Linux shows it in /proc (since 4.7); elsewhere it can only be
    read by setting it, which another thread creating a file in that instant would see."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def replacement_mode(path, only_owner_writes: bool = False, new: int | None = None) -> int:
    """The permission bits a file written at ``path`` should get: those of the file it
    replaces, so a shared checkpoint stays readable to whoever could read it, else ``new`` (by
    default what a plain ``open()`` gives: 0666 less the umask). ``only_owner_writes`` clears
    group and others' write bits, for a file that is later refused unless only this user can
    have written it (``check_trusted_file``: plans, generated code)."""
    try:
        st = os.stat(path)
        mode = stat.S_IMODE(st.st_mode) & 0o777 if stat.S_ISREG(st.st_mode) else None
    except OSError:
        mode = None
    if mode is None:
        mode = 0o666 & ~_umask() if new is None else new
    return mode & ~0o022 if only_owner_writes else mode


def _write_refusal(path: str, what: str, exc: OSError, error: Refusal) -> Exception:
    """``exc``, met writing ``path``, as ``error`` naming the path and the fix."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        why = f"it is a directory; give the path of a {what} (a new name inside it, say)"
    elif _irregular(path):
        why = (f"it is {_irregular(path)}, which writing the {what} would replace, not write "
               f"into; give the path of a regular file")
    elif not os.path.isdir(folder):
        why = (f"its folder {folder} does not exist" if not os.path.exists(folder)
               else f"{folder} is not a folder")
        why += "; create the folder first (mkdir -p) or give a path in an existing one"
    else:
        why = (f"{exc.strerror or exc}; check that you may write into {folder} and that the "
               "disk is not full")
    return error(f"cannot write {what} {path}: {why}")


@contextmanager
def atomic_write(path, mode: str = "w", *, what: str = "file",
                 only_owner_writes: bool = False,
                 error: Refusal = SerializationError) -> Iterator[IO]:
    """Write to a temporary file next to ``path``, then rename it over ``path`` (readers see the
    old file or the whole new one; a failure leaves no temporary file behind).

    The file gets ``replacement_mode``: the temporary file is created 0666 and narrowed by the
    kernel (umask, a folder's default ACL) as ``open()`` would be, since ``mkstemp``'s 0600 made
    every shared checkpoint or report unreadable to others. A path that cannot be written (a
    directory, a missing folder, no permission) raises ``error`` naming ``what`` and the fix;
    what the ``with`` body raises passes through."""
    path = _through_links(path_of(path, what))
    folder = os.path.dirname(os.path.abspath(path))
    check_replaceable(path, what, error)  # before the caller renders what would be lost
    flags = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
             | getattr(os, "O_BINARY", 0))
    for _ in range(100):
        tmp = os.path.join(folder, f".{os.path.basename(path)}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, flags, 0o666)
            break
        except FileExistsError:
            continue
        except OSError as exc:
            raise _write_refusal(path, what, exc, error) from None
    else:
        raise error(f"cannot write {what} {path}: no free temporary name in {folder}")
    body_done = False
    try:
        try:
            made = stat.S_IMODE(os.fstat(fd).st_mode)
            wanted = replacement_mode(path, only_owner_writes, new=made)
            if wanted != made and hasattr(os, "fchmod"):
                os.fchmod(fd, wanted)
            f = os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"}))
        except BaseException:
            os.close(fd)
            raise
        with f:
            yield f
            body_done = True
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if body_done and isinstance(exc, OSError):  # ours: flush, fsync, rename
            raise _write_refusal(path, what, exc, error) from None
        raise


def _through_links(path: str) -> str:
    """The file a symbolic link at ``path`` leads to, else ``path``: renaming over the link
    would replace the link itself, leaving the file it points to (a lock file kept in a
    shared checkout, say) stale while the user's link was gone."""
    return os.path.realpath(path) if os.path.islink(path) else path


# Who may have written a path we load code or plans from: this user, or root (a system-wide
# install). Anyone else could have planted what we would run.
_TRUSTED_OWNERS = frozenset({os.getuid(), 0}) if hasattr(os, "getuid") else frozenset()


def untrusted_reason(path, subject: str = "it") -> str | None:
    """Why ``path`` (a file or a folder) may hold what another local user wrote, or None when
    only this user (or root) can have written it: owned by another user, or writable by group or
    others. A symbolic link is judged by both the link and what it points to. The reason is a
    clause about ``subject`` ("it is writable by others"), to fit the caller's sentence."""
    if not hasattr(os, "getuid"):  # no POSIX owners (Windows): nothing to compare
        return None
    path = os.fspath(path)
    for follow in (False, True):
        st = os.stat(path, follow_symlinks=follow)
        link = not follow and os.path.islink(path)
        what = ("the link" if subject == "it" else f"the link {subject}") if link else subject
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
        why = untrusted_reason(target, "it" if target == path else f"its folder {target}")
        if why:
            raise UntrustedPathError(
                f"refusing to load {what} {path}: {why}, so "
                f"another user could have changed it. Make it writable only by you (chmod "
                f"go-w) or copy it to a folder only you can write.")


# ---------------------------------------------------------------------------- reading
# What a path may be instead of a regular file, as an error names it. Only regular files are
# read: opening a FIFO waits until another process writes to it, and a device is no file.
_IRREGULAR: tuple[tuple[Callable[[int], bool], str], ...] = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def check_replaceable(path: str, what: str = "file", error: Refusal = SerializationError) -> None:
    """Raise ``error`` naming ``path`` unless a file written aside may be renamed over it: a
    directory cannot be, and a device, a FIFO or a socket would be replaced, not written:
    `tg db export /dev/full` as root replaced the device node with a regular file of rows
    (and /dev/null would have gone the same way)."""
    if os.path.isdir(path) or _irregular(path):
        raise _write_refusal(path, what, IsADirectoryError(21, "Is a directory"), error)


def _irregular(path) -> str | None:
    """What ``path`` is when it exists and is neither a regular file nor a directory ("a FIFO
    (named pipe)", "a character device"), else None. A symbolic link is judged by its
    target (/dev/stdout, a link to the terminal or a pipe, is a character device or a FIFO)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return next((name for test, name in _IRREGULAR if test(mode)), "not a file")


def check_regular(path, mode: int, fix: str, error: Refusal = SerializationError) -> None:
    """Raise ``error`` naming ``path``, what it is instead and ``fix`` unless ``mode`` (its
    ``st_mode``) is a regular file's."""
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _IRREGULAR if test(mode)), "not a file")
    raise error(f"{os.fspath(path)} is {kind}, not a regular file; {fix}")


def path_of(path, what: str) -> str:
    """``path`` (a str, bytes or os.PathLike) as a str. Anything else is an ``ArgumentError``
    naming ``what``: an int would be taken for a file descriptor (0 reads standard input)."""
    try:
        return os.fsdecode(os.fspath(path))
    except TypeError:
        raise ArgumentError(f"expected the path of a {what} (a str or os.PathLike), got "
                            f"{type(path).__name__}") from None


def open_regular(path, what: str, fix: str, error: Refusal = SerializationError) -> BinaryIO:
    """``path`` opened for binary reading: the one way a file that will be parsed is opened.
    It is opened non-blocking and judged by ``fstat`` of what was opened, so a FIFO is refused
    at once instead of waited on, and nothing swapped in after the check is read instead.
    ``what`` names the file's role ("graph file"), ``fix`` says what to give instead; every
    failure raises ``error`` with both (a ``path`` that is no path: ``path_of``)."""
    path = path_of(path, what)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise error(f"{path}: no such {what}; check the path") from None
    except OSError as exc:
        try:
            mode = os.stat(path).st_mode  # a socket cannot be opened: say what it is
        except OSError:
            mode = stat.S_IFREG
        check_regular(path, mode, fix, error)
        raise error(f"cannot open {what} {path}: {exc.strerror or exc}; check the path and its "
                    "permissions") from None
    try:
        check_regular(path, os.fstat(fd).st_mode, fix, error)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path, what: str, fix: str, error: Refusal = SerializationError,
                 most: int | None = None) -> bytes:
    """The bytes of the regular file at ``path`` (``open_regular``). With ``most``, a file
    larger than that is refused without reading past it (no file of its role is that large)."""
    with open_regular(path, what, fix, error) as f:
        try:
            data = f.read() if most is None else f.read(most + 1)
        except OSError as exc:
            raise error(f"cannot read {what} {os.fspath(path)}: {exc.strerror or exc}; "
                        f"{fix}") from None
    if most is not None and len(data) > most:
        raise error(f"{os.fspath(path)} is larger than {most / 2**20:g} MiB, which no {what} "
                    f"is; {fix}")
    return data


def parse_json(data: bytes | str, source: str, what: str, fix: str,
               error: Refusal = SerializationError,
               object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None) -> Any:
    """``data`` (read from ``source``, a file or "file, line 3") parsed as JSON, where every
    way untrusted bytes fail is one ``error`` naming ``source`` and ``fix``: not UTF-8, not
    JSON, nested deeper than the parser recurses (a RecursionError, so the recursion limit
    bounds the nesting), a number of more digits than int() converts (a bare ValueError).
    What ``object_pairs_hook`` raises as a TensorGraphsError passes through."""
    def refuse(why: str) -> Exception:
        return error(f"{source} is not a {what}: {why}; {fix}")

    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise refuse(f"it is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        return json.loads(text, object_pairs_hook=object_pairs_hook)
    except TensorGraphsError:
        raise
    except RecursionError:
        raise refuse("its JSON is nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise refuse(f"it is not valid JSON ({exc})") from None
    except ValueError:  # int(): more than sys.get_int_max_str_digits() (4,300) digits
        raise refuse("it holds a number of thousands of digits") from None
