"""What ``tg`` accepts on its command line: the argparse ``type=`` of every option that takes a
number, a file or a dim, and the parser that reports a bad one in one line.

A value is checked where it is parsed, so a negative batch or a directory given as a graph file
is a usage error (exit 2) naming the option before anything is loaded, measured or written,
instead of a traceback from deep inside the command. What only the command can find out (a dim
the graph lacks, a corrupt file) is reported by ``tg.cli.main`` in the same one-line form."""

from __future__ import annotations

import argparse
import difflib
import math
import os
import shlex
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from tensor_graphs.files import check_regular
from tensor_graphs.ir.shapes import MAX_DIM_INT, MAX_DIM_INT_TEXT

T = TypeVar("T")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser (and, through ``add_subparsers``, every subcommand's) that reports a
    bad command line as one line, ``tg demo: error: argument --batch: ...``, without the usage
    text, and exits 2 as argparse does. Every (sub)command takes ``--traceback``; the parsed
    namespace's ``prog_name`` is the deepest subcommand's ("tg db stats"), for messages. Every
    one takes ``--quiet`` too, so it may come before or after the subcommand."""

    def __init__(self, *args, **kwargs):
        self._apart: list[tuple[str, str, str]] = []  # refuse_together's (first, second, why)
        self._only: list[tuple[str, str, tuple, str]] = []  # only_for's (option, selector,
        #                                                      values, what it applies to)
        super().__init__(*args, **kwargs)
        # SUPPRESS: a subcommand's unset flag must not hide `tg --traceback COMMAND`
        self.add_argument("--traceback", action="store_true", default=argparse.SUPPRESS,
                          help="on an error, show the Python traceback (as TG_DEBUG=1 does)")
        self.add_argument("--quiet", action="store_true", default=argparse.SUPPRESS,
                          help="no progress bars and no notes on stderr (errors still are)")

    def add_argument(self, *names, **kwargs):
        """An option every command means alike (SHARED, below) gets its one type wherever it
        is added, unless the command gives its own: ``--db`` is checked as ``database``."""
        for name in names:
            if name in SHARED and "type" not in kwargs:
                kwargs["type"] = SHARED[name]
        return super().add_argument(*names, **kwargs)

    def refuse_together(self, first: str, second: str, why: str) -> None:
        """Refuse options ``first`` and ``second`` (each defaulting to None) on one command
        line, as a usage error naming both and ``why``: argparse's mutually exclusive groups
        say only that they are, not why the second would do nothing."""
        known = {o for a in self._actions for o in a.option_strings}
        for option in (first, second):
            if option not in known:  # a typo here would fail at parse time, as a tg bug
                raise ValueError(f"refuse_together: {self.prog} has no option {option}; "
                                 "add it first")
        self._apart.append((first, second, why))

    def only_for(self, option: str, selector: str, values: tuple, what: str) -> None:
        """Refuse ``option`` set to other than its default unless argument ``selector`` (a
        dest) is one of ``values``, as a usage error saying it applies to ``what`` only: an
        option the chosen mode never reads would be ignored without a word."""
        if option not in {o for a in self._actions for o in a.option_strings}:
            raise ValueError(f"only_for: {self.prog} has no option {option}; add it first")
        self._only.append((option, selector, tuple(values), what))

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        namespace, extras = super().parse_known_args(args, namespace)
        dests = {o: a.dest for a in self._actions for o in a.option_strings}
        for first, second, why in self._apart:
            if all(getattr(namespace, dests[o], None) is not None for o in (first, second)):
                self.error(f"argument {second}: not allowed with {first}: {why}")
        for option, selector, values, what in self._only:
            chosen = getattr(namespace, selector, None)
            if chosen not in values and getattr(namespace, dests[option], None) != \
                    self.get_default(dests[option]):
                self.error(f"argument {option}: applies to {what} only, and would be ignored "
                           f"with {chosen}")
        if getattr(namespace, "prog_name", None) is None:  # a subcommand's parser ran first
            namespace.prog_name = self.prog
        return namespace, extras


def _checked(name: str, parse: Callable[[str], T], ok: Callable[[T], bool],
             wanted: str) -> Callable[[str], T]:
    """An argparse type: ``parse(text)``, refused with "expected <wanted>" unless ``ok``."""

    def convert(text: str) -> T:
        try:
            value = parse(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}")
        return value

    convert.__name__ = name
    return convert


# numbers an option takes; nan and inf are refused everywhere (no option means them)
positive_int = _checked("positive_int", int, lambda v: v >= 1, "a whole number of 1 or more")
count = _checked("count", int, lambda v: v >= 0, "a whole number of 0 or more")
positive_float = _checked("positive_float", float, lambda v: math.isfinite(v) and v > 0,
                          "a number above 0")
non_negative_float = _checked("non_negative_float", float,
                              lambda v: math.isfinite(v) and v >= 0, "a number of 0 or more")


def existing_file(text: str) -> str:
    """An argparse type: a path to a regular file that exists. A directory, a FIFO (reading it
    would wait forever) or a device is refused by name (``files.check_regular``)."""
    try:
        mode = os.stat(text).st_mode
    except FileNotFoundError:
        raise argparse.ArgumentTypeError(f"no such file: {text!r}") from None
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {text!r}: {exc.strerror}") from None
    check_regular(repr(text), mode, "give a file", argparse.ArgumentTypeError)
    return text


def input_file(text: str) -> str:
    """An argparse type: '-' (standard input) or an existing regular file."""
    return text if text == "-" else existing_file(text)


def output_file(text: str) -> str:
    """An argparse type: '-' (standard output) or a path that can be created or replaced: its
    folder exists and it is not a directory."""
    if text == "-":
        return text
    return new_file(text)


def new_file(text: str) -> str:
    """An argparse type: a path that can be created or replaced (its folder exists and it is
    not a directory), not '-': for a file written after long work (trained weights), so a
    typo in the path is refused before the work, not after it."""
    if text == "-":
        raise argparse.ArgumentTypeError("'-' is standard output, which takes no binary "
                                         "file; give a file path")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a directory; give a file path in it")
    try:  # a device or a FIFO would be replaced by the file (files.atomic_write), not fed
        mode = os.stat(text).st_mode
    except OSError:
        mode = None  # none yet (or no folder: said below)
    if mode is not None:
        check_regular(repr(text), mode, "give a file path", argparse.ArgumentTypeError)
    folder = os.path.dirname(text) or "."
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: no folder {folder!r}")
    return text


def folder(text: str) -> str:
    """An argparse type: a folder to keep files in, made (with its parents) when missing, so
    not a path to something else: a file given as ``--out`` was refused only when the command
    came to make the folder, as "FILE: File exists", which names neither the option nor the
    fix."""
    if os.path.lexists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a folder; give a folder "
                                         "path (a missing one is made)")
    return text


def database(text: str) -> str:
    """An argparse type: ``--db``'s measurement database, a file whose folder exists (as the
    other paths a command writes), ':memory:', or a PostgreSQL URL. A missing folder is refused
    rather than made: the database opens a file path as given and would make every folder on
    the way, so a typo became a new tree and an empty database. The default cache file passes
    (its folder is made private when it is opened, as the Python API's db= does)."""
    from tensor_graphs.db.store import is_cache_default, is_url

    if text == ":memory:" or is_url(text) or is_cache_default(text):
        return text
    path = os.path.expanduser(text)
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(
            f"cannot open the database {text!r}: no folder {folder!r}; make it first (mkdir "
            f"-p {shlex.quote(folder)}) or give a file in an existing folder")
    return text


# options every command means alike, each with its one type (Parser.add_argument gives it)
SHARED: dict[str, Callable[[str], Any]] = {"--db": database}


def dim_binding(text: str) -> tuple[str, int]:
    """An argparse type: ``NAME=VALUE`` binding a symbolic dim to a size of 1 to MAX_DIM_INT
    (the IR's own bound on the integers of a size)."""
    name, sep, value = text.partition("=")
    try:
        size = int(value) if sep and name.isidentifier() else 0
    except ValueError:
        size = 0
    if not 1 <= size <= MAX_DIM_INT:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE with a size of 1 to "
                                         f"{MAX_DIM_INT_TEXT} (e.g. seq=128), got {text!r}")
    return name, size


def choice_of(what: str, known: Callable[[], Any]) -> Callable[[str], str]:
    """An argparse type: one of ``known()`` (a collection, computed when the value is parsed so
    that kernels loaded later count); anything else is refused with the list."""

    def convert(text: str) -> str:
        names = sorted(known())
        if text not in names:
            if len(names) <= 10:
                hint = f"known: {', '.join(names)}"
            else:  # a long list would not fit one line: the nearest names instead
                near = difflib.get_close_matches(text, names, n=3)
                hint = f"did you mean {' or '.join(near)}?" if near else f"{len(names)} known"
            raise argparse.ArgumentTypeError(f"no {what} {text!r}; {hint}")
        return text

    convert.__name__ = what.replace(" ", "_")
    return convert
