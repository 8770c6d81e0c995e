"""``tg env``: every ``TG_*`` environment variable tensor_graphs reads, in one table.

The variables are read where they act (the database path in db/store.py, the C cache in
kernels/c/build.py, ...); this table is where a user finds them all, and
tests/test_cli_env.py fails when the package reads a ``TG_*`` name this table lacks."""

from __future__ import annotations

import argparse
import os

from tensor_graphs.commands import output

# name -> (what applies when it is unset, one line on what it does)
ENV: dict[str, tuple[str, str]] = {
    "TG_DB": ("~/.cache/tensor_graphs/measurements.sqlite",  # db/store.py
              "the measurement database: a file path or a postgresql:// URL"),
    "TG_CACHE_DIR": ("~/.cache/tensor_graphs",  # kernels/c/build.py
                     "where compiled C kernel libraries are kept (in its c/ folder)"),
    "TG_DEBUG": ("0",  # compiler.py, cli.py
                 "1: time each compiler pass and show tracebacks; 2: also check each pass"),
    "TG_NUM_THREADS": ("OMP_NUM_THREADS, else the cores",  # threads.py
                       "threads for the C kernels (and torch's, as set_num_threads does)"),
    "TG_SIMULATED_CUDA": ("unset: no simulated GPU",  # devices.py
                          "1 or a capacity in bytes: cuda:0 is a GPU simulated in host memory"),
    "TG_C_SANITIZE": ("unset: no sanitizer",  # kernels/c/build.py
                      "comma-separated sanitizers (address, undefined) to build C kernels with"),
    "TG_INT8_ISA": ("auto: the widest this CPU runs",  # kernels/c/quant_dyn.py
                    "the int8 GEMM's path: avx512-vnni, avx-vnni, avx2 or portable"),
    "TG_LOWP_ISA": ("auto: the widest this CPU runs",  # kernels/c/quant_lowp.py
                    "the float16/int4-weight GEMM's path: avx512, avx2 or portable"),
}


def rows(environ: dict[str, str] | None = None) -> list[dict[str, str]]:
    """Each variable with its value now and where that value comes from."""
    environ = dict(os.environ) if environ is None else environ
    return [{"name": name, "value": environ.get(name, default),
             "source": "environment" if name in environ else "default", "meaning": meaning}
            for name, (default, meaning) in sorted(ENV.items())]


def _env(args: argparse.Namespace) -> int:
    output.emit(rows(), args.output_format, ("name", "value", "source", "meaning"))
    return 0


def add_env_command(sub) -> None:
    """Register ``tg env`` on the ``tg`` subparsers."""
    p = sub.add_parser("env", help="the TG_* environment variables, their values and meaning",
                       description="Lists every TG_* environment variable tensor_graphs reads, "
                                   "its value in this environment (or the default that applies "
                                   "when it is unset), where the value comes from, and what it "
                                   "does.")
    output.add_output_option(p)
    p.set_defaults(run=_env)
