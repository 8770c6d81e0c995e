"""The ``tg`` command line."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from tensor_graphs.cli_args import Parser, choice_of, count, existing_file, positive_int
from tensor_graphs.commands import output
from tensor_graphs.commands.db import add_db_commands
from tensor_graphs.commands.env import add_env_command
from tensor_graphs.commands.kernels_compile import add_compile_command
from tensor_graphs.commands.kernels_generate import add_generate_command
from tensor_graphs.commands.profile import add_plan_commands
from tensor_graphs.commands.quality import add_quality_command
from tensor_graphs.errors import ArgumentError, DeviceError, TensorGraphsError
from tensor_graphs.jobs.cli import add_run_command

# tg's exit statuses, the one list --help's epilog and README show; FAILURES maps errors onto them
OK, FAILURE, USAGE, INTERRUPTED = 0, 1, 2, 130
EXIT_CODES: tuple[tuple[int, str, str], ...] = (  # (status, name, when)
    (OK, "ok", "the command did what it was asked"),
    (FAILURE, "failure", "a file, database or graph refused, a check that failed (tg kernels "
                         "verify, tg run's agreement), or stdout closed early (tg ... | head)"),
    (USAGE, "usage", "a bad argument or option, found by the parser or by the command"),
    (INTERRUPTED, "interrupted", "Ctrl-C (128 + SIGINT, as shells report it)"),
)


def _epilog() -> str:
    codes = ", ".join(f"{code} {name}" for code, name, _ in EXIT_CODES)
    return ("A bad argument or file ends a command with one line on stderr: 'tg COMMAND: "
            "error: ...'. Set TG_DEBUG=1 (or pass --traceback) to see the Python traceback "
            f"instead. Exit status: {codes}. Listings take -o json|csv|md (data on stdout, "
            "notes on stderr); --quiet silences progress and notes; tg env lists the TG_* "
            "environment variables.")


def _demo(args: argparse.Namespace) -> int:
    from tensor_graphs import demo

    return demo.main(batch=args.batch, seq=args.seq, show=args.show)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="tg",
        description="tensor_graphs: write a tensor program as a graph of a few atomic ops, "
                    "evaluate it exactly with the numpy reference, and run the fastest "
                    "verified plan for this machine, chosen from a database of kernel "
                    "measurements (tg profile fills it; tg explain shows a plan).",
        epilog=_epilog())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_run_command(sub)
    demo = sub.add_parser(
        "demo", help="build a small transformer block, print its graph and evaluate it",
        description="Builds one pre-norm transformer block (d_model 64, 4 heads, symbolic "
                    "batch and seq) with the fluent API, prints its graph, and evaluates it "
                    "with random weights in float32 and float64, reporting the difference.")
    demo.add_argument("--batch", type=positive_int, default=2,
                      help="batch size to evaluate (default 2)")
    demo.add_argument("--seq", type=positive_int, default=16,
                      help="sequence length (default 16)")
    demo.add_argument("--show", type=count, default=40,
                      help="how many lines of the graph listing to print (default 40)")
    demo.set_defaults(run=_demo)
    _add_kernels(sub)
    add_db_commands(sub)
    add_plan_commands(sub)
    add_quality_command(sub)
    add_env_command(sub)
    return parser


# ---------------------------------------------------------------------------- tg kernels ...
def _kernels_list(args: argparse.Namespace) -> int:
    from tensor_graphs import kernels
    from tensor_graphs.kernels.registry import describe

    rows = [k for k in kernels.all()
            if (not args.backend or k.backend in args.backend)
            and (not args.op or k.op in args.op)
            and (not args.name or args.name in k.name)]
    table = [{"name": k.name, "backend": k.backend, "device": k.device,
              "pattern": describe(k.pattern), "tolerance": k.tolerance} for k in rows]
    output.emit(table, args.output_format, ("name", "backend", "device", "pattern", "tolerance"),
                shown=lambda r: {**r, "tolerance": f"{r['tolerance']:g}"})
    output.note(f"\n{len(rows)} kernels" + (f" (of {len(kernels.all())})" if len(rows) !=
                                             len(kernels.all()) else ""), args.output_format)
    return 0


def _kernels_verify(args: argparse.Namespace) -> int:
    from tensor_graphs import kernels
    from tensor_graphs.errors import KernelVerificationError

    if args.file:
        try:
            admitted = kernels.load(args.file)
        except KernelVerificationError as exc:  # the kernels that passed are still admitted
            output.error(f"{args.prog_name}: error: {exc}")
            for k in getattr(exc, "admitted", []):
                print(f"admitted {k.name}")
            return 1
        for k in admitted:
            print(f"admitted {k.name}: {kernels.verify(k).summary()}")
        if not admitted:
            print(f"{args.file} defines no kernels")
        return 0
    chosen = []
    for name in args.names or [k.name for k in kernels.all()]:
        matches = [k for k in kernels.all() if k.name == name] or \
            [k for k in kernels.all() if name in k.name or k.backend == name]
        if not matches:
            raise ArgumentError(f"no kernel named or matching '{name}' (tg kernels list "
                                f"shows them)")
        chosen += [k for k in matches if k not in chosen]
    if args.backend:
        chosen = [k for k in chosen if k.backend in args.backend]
    failed = skipped = 0
    rows = []
    # a line per kernel as it is verified: on stdout for people, stderr beside machine rows
    say = output.info if args.output_format != "table" else lambda t: print(t, flush=True)
    for i, k in enumerate(chosen, 1):
        report = kernels.verify(k, seed=args.seed)
        mark = "skip" if report.skipped else ("ok" if report.ok else "FAIL")
        say(f"[{i}/{len(chosen)}] {mark:4} {report.summary()}")
        rows.append({"kernel": k.name, "backend": k.backend, "result": mark,
                     "max_rel_error": None if report.skipped else report.max_rel_error,
                     "tolerance": k.tolerance, "cases": len(report.shapes),
                     "failures": "; ".join(report.failures), "skipped": report.skipped})
        if report.skipped:
            skipped += 1
        elif not report.ok:
            failed += 1
            for line in report.failures[:5]:
                say(f"        {line}")
        if args.verbose:
            for line in report.shapes:
                say(f"        tried: {line}")
    if args.output_format != "table":
        output.emit(rows, args.output_format, VERIFY_COLUMNS)
    output.note(f"{len(chosen) - failed - skipped} passed, {failed} failed"
                + (f", {skipped} not verified (their device is not on this machine)"
                   if skipped else ""), args.output_format)
    return 1 if failed else 0


VERIFY_COLUMNS = ("kernel", "backend", "result", "max_rel_error", "tolerance", "cases",
                  "failures", "skipped")


def _kernels_prompt(args: argparse.Namespace) -> int:
    from tensor_graphs import kernels

    print(kernels.prompt(args.pattern, name=args.name, backend=args.backend), end="")
    return 0


def _backends() -> tuple[str, ...]:
    from tensor_graphs.kernels.registry import BACKENDS

    return BACKENDS


def _ops() -> set[str]:
    from tensor_graphs.ir.ops import OPS

    return set(OPS)


def _add_kernels(sub) -> None:
    kern = sub.add_parser(
        "kernels", help="list, verify and write kernels (tg kernels --help)",
        description="Kernels implement a pattern (an op or a fused subgraph) on a backend "
                    "(numpy, c, torch, ...). Every kernel is checked against the float64 "
                    "reference before it is used.")
    ksub = kern.add_subparsers(dest="kernels_command", metavar="SUBCOMMAND")
    kern.set_defaults(run=lambda args: (kern.print_help(), 0)[1])

    ls = ksub.add_parser("list", help="table of registered kernels",
                         description="One row per registered kernel: name, backend, device "
                                     "kind, the pattern it implements and its declared "
                                     "tolerance (norm-wise relative error).")
    ls.add_argument("--backend", action="append", type=choice_of("backend", _backends),
                    help="only this backend (repeatable)")
    ls.add_argument("--op", action="append", type=choice_of("op", _ops),
                    help="only kernels rooted at this op (repeatable)")
    ls.add_argument("--name", help="only kernels whose name contains this text")
    output.add_output_option(ls)
    ls.set_defaults(run=_kernels_list)

    ver = ksub.add_parser(
        "verify", help="check kernels against the float64 reference",
        description="Runs each kernel on fresh random inputs (sizes 1, 7, 33, 1025; broadcast, "
                    "strided; NaN/inf for elementwise kernels) and compares with the float64 "
                    "reference by norm-wise relative error. Exits 1 when any kernel fails.")
    ver.add_argument("names", nargs="*", metavar="NAME",
                     help="kernel names (or parts of names, or a backend); default: all")
    ver.add_argument("--backend", action="append", type=choice_of("backend", _backends),
                     help="only this backend (repeatable)")
    ver.add_argument("--seed", type=count, default=None,
                     help="random seed, a whole number of 0 or more (default: fresh)")
    ver.add_argument("--file", type=existing_file,
                     help="load this Python file of @tg.kernel definitions: verify its "
                          "kernels and admit those that pass")
    ver.add_argument("-v", "--verbose", action="store_true", help="list every case tried")
    output.add_output_option(ver)
    ver.set_defaults(run=_kernels_verify)

    pr = ksub.add_parser(
        "prompt", help="print a request to write a kernel for a pattern",
        description="Prints the pattern's reference graph (and its atomic decomposition), the "
                    "kernel signature expected and how it will be verified: text ready to hand "
                    "to a person or a language model. PATTERN is an op name (layer_norm), a "
                    "kernel name, or an expression whose free names are the inputs "
                    "('gelu(x @ w + b)', 'lambda a, b, c: a * b + c').")
    pr.add_argument("pattern", metavar="PATTERN", help="op name, kernel name or expression")
    pr.add_argument("--name", help="the kernel's name in the template (default my_<op>)")
    pr.add_argument("--backend", default="numpy", type=choice_of("backend", _backends),
                    help="backend in the template (numpy)")
    pr.set_defaults(run=_kernels_prompt)

    add_generate_command(ksub)
    add_compile_command(ksub)


# How main reports each kind of failure: (exception, its one-line message, exit status, one of
# EXIT_CODES); the first match wins.
FAILURES: tuple[tuple[type[BaseException], Callable[[Any], str], int], ...] = (
    (ArgumentError, str, USAGE),  # a bad argument found by the command (an unknown dim ...)
    (DeviceError, str, USAGE),  # --device names no device of this machine
    (TensorGraphsError, str, FAILURE),  # a file, database or graph refused: the message says why
    (OSError, lambda e: f"{e.filename}: {e.strerror}" if e.filename and e.strerror
     else str(e) or type(e).__name__, FAILURE),  # a file that cannot be read or written
    (ModuleNotFoundError, lambda e: f"{e}: this command needs it installed (pip install "
     f"{(e.name or '?').split('.')[0].replace('_', '-')})", FAILURE),
    (MemoryError, lambda e: f"out of memory: {e}" if str(e) else "out of memory", FAILURE),
    (KeyboardInterrupt, lambda e: "interrupted", INTERRUPTED),
    (Exception, lambda e: f"internal error, {type(e).__name__}: {e} (a bug in tensor_graphs; "
     "TG_DEBUG=1 shows the traceback to report)", FAILURE),
)


def _report(exc: BaseException, prog: str) -> int:
    """Print ``exc`` as one line on stderr (the FAILURES table) and return the exit status.
    The exception's notes end the line: an importer's note names the node that failed
    ("while importing Reshape node '/mha/Reshape_4'"), which the message alone does not."""
    for kind, message, status in FAILURES:
        if isinstance(exc, kind):
            notes = [" ".join(str(n).split()) for n in getattr(exc, "__notes__", ()) or ()]
            said = message(exc) + "".join(f" ({n})" for n in notes if n)
            print(f"{prog}: error: {said}", file=sys.stderr)
            return status
    raise exc


class _Interrupts:
    """Remembers a Ctrl-C while a command runs. Python raises KeyboardInterrupt wherever the
    main thread is, and some libraries lose it there: numpy imports ``numpy.random`` lazily,
    and an interrupt landing in that import was swallowed, so ``tg demo`` ran to the end and
    exited 0. The flag lets ``main`` still report the interrupt."""

    def __enter__(self) -> _Interrupts:
        self.seen = False
        self._previous = None
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def _on_sigint(self, signum, frame):
        self.seen = True
        raise KeyboardInterrupt

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


@contextlib.contextmanager
def _quieted(quiet: bool):
    """``--quiet``: while the command runs, ``sys.stderr`` (progress bars, notes, warnings)
    goes nowhere; error lines still reach the real one (``output.error``, ``_report``)."""
    output.set_quiet(quiet, sys.stderr)
    try:
        if not quiet:
            yield
            return
        with open(os.devnull, "w") as sink, contextlib.redirect_stderr(sink):
            yield
    finally:
        output.set_quiet(False)


def main(argv: list[str] | None = None) -> int:
    """Run one ``tg`` command and return its exit status. A command line the parser refuses
    exits 2 (SystemExit, as argparse does) after one line from ``cli_args.Parser``; whatever
    fails once the command runs is reported here, one ``tg COMMAND: error: ...`` line
    (FAILURES) rather than a traceback, unless TG_DEBUG=1 or --traceback asks for it."""
    parser = build_parser()
    args = None
    try:
        args = parser.parse_args(argv)
        if not getattr(args, "run", None):
            parser.print_help()
            return OK
        with _Interrupts() as interrupts, _quieted(getattr(args, "quiet", False)):
            status = args.run(args)
        if interrupts.seen:  # a library swallowed the KeyboardInterrupt: the user still asked
            raise KeyboardInterrupt
        sys.stdout.flush()  # a closed pipe fails here, not at exit where nothing catches it
        return status
    except BrokenPipeError:  # `tg ... | head` closed stdout: not an error worth a line
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return FAILURE
    except (Exception, KeyboardInterrupt) as exc:
        if os.environ.get("TG_DEBUG", "") not in ("", "0") or getattr(args, "traceback", False):
            raise
        return _report(exc, getattr(args, "prog_name", parser.prog))


if __name__ == "__main__":
    sys.exit(main())
