"""The command line shared by the generated docs pages (docs/ops.md, docs/kernels.md):
write the page, ``--check`` that it is current (exit 1 when stale), or ``--print`` it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def main(render: Callable[[], str], default: Path, command: str, description: str,
         argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=command, description=description)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help="exit with status 1 when the file is stale")
    mode.add_argument("--print", action="store_true", help="print the page instead")
    parser.add_argument("--output", type=Path, default=default, help=f"default: {default.name}")
    args = parser.parse_args(argv)
    text = render()
    if args.print:
        sys.stdout.write(text)
        return 0
    current = args.output.read_text(encoding="utf-8") if args.output.exists() else None
    if args.check:
        if current != text:
            print(f"{args.output} is stale; run `{command}` to regenerate it", file=sys.stderr)
            return 1
        print(f"{args.output} is up to date")
        return 0
    if current != text:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text, encoding="utf-8")
        print(f"wrote {args.output}")
    return 0
