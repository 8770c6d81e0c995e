"""Render docs/ops.md, the op reference, from the op table.

    python -m tensor_graphs.tools.opdocs            # (re)write docs/ops.md
    python -m tensor_graphs.tools.opdocs --check    # exit 1 when docs/ops.md is stale
    python -m tensor_graphs.tools.opdocs --print    # print the rendered page

The page is a pure function of the registered ops: leaves and atomic ops in the order of the
atomic table, composites grouped by the module that defines them, alphabetical within a group.
Only ops defined inside tensor_graphs are listed, so ops registered by tests or user code do not
leak into the page.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import tensor_graphs  # noqa: F401  (registers every op)
from tensor_graphs.ir.node import Op
from tensor_graphs.ir.ops import OPS
from tensor_graphs.ir.ops.atomic import ATOMIC_OPS, LEAF_OPS
from tensor_graphs.tools import docgen

DOCS_PATH = Path(__file__).resolve().parents[2] / "docs" / "ops.md"
COMMAND = "python -m tensor_graphs.tools.opdocs"

# Section titles of the composite modules, in reading order; other modules follow by name.
GROUPS = {
    "elementwise": "Elementwise and activations",
    "reductions": "Reductions and the softmax family",
    "nn": "Neural-network layers",
    "losses": "Losses",
    "conv": "Convolution and pooling",
    "shape_ops": "Shape manipulation",
    "gradient": "Gradient marks",
}

INTRO = f"""\
# Ops

<!-- Generated from the op table by `{COMMAND}`; do not edit by hand. -->

Every graph node applies one op. *Leaves* have no inputs: values fed at each call, bound once
or baked into the graph. *Atomic* ops are the closed set that every kernel, rewrite and the
numpy reference interpreter understand; each has exactly one numpy reference implementation.
*Composite* ops are defined only by their decomposition into other ops (`tg.decompose(y)`
expands them); a backend kernel may implement a composite directly, but the decomposition is
its meaning.

Columns: **tensor params** are the tensor inputs in order (`?` marks an optional one, `...` a
variadic list); **attributes** are the non-tensor arguments with their defaults (one without a
default is required). The `tg.*` builder functions accept more convenient forms (negative
axes, Python scalars, torch's pad order) and normalise them into these attributes.
"""


def _cell(text: str) -> str:
    """Make text safe inside a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(value) -> str:
    text = repr(value)
    if " at 0x" in text:  # an object without a stable repr
        text = f"<{type(value).__name__}>"
    return text


def _params(op: Op) -> str:
    if op.variadic:
        return ", ".join(f"`{p}...`" for p in op.params)
    return ", ".join(f"`{p}?`" if p in op.optional else f"`{p}`" for p in op.params) or "—"


def _attrs(op: Op) -> str:
    shown = [f"`{k}`" if v is inspect.Parameter.empty else f"`{k}={_default(v)}`"
             for k, v in op.attr_defaults.items()]
    return _cell(", ".join(shown)) if shown else "—"


def _table(ops: list[Op]) -> list[str]:
    lines = ["| op | kind | tensor params | attributes | meaning |",
             "|---|---|---|---|---|"]
    for op in ops:
        lines.append(f"| `{op.name}` | {op.kind} | {_params(op)} | {_attrs(op)} | "
                     f"{_cell(op.doc)} |")
    return lines


def _module(op: Op) -> str | None:
    """The module under tensor_graphs.ir.ops that defines a composite (None: defined elsewhere)."""
    module = getattr(op.decompose, "__module__", "") or ""
    prefix = "tensor_graphs.ir.ops."
    return module[len(prefix):] if module.startswith(prefix) else None


def render() -> str:
    """The text of docs/ops.md for the ops registered now."""
    leaves = [OPS[n] for n in LEAF_OPS if n in OPS]
    atomic = [OPS[n] for n in ATOMIC_OPS if n in OPS]
    groups: dict[str, list[Op]] = {}
    for op in OPS.values():
        if op.kind == "composite" and _module(op) is not None:
            groups.setdefault(_module(op), []).append(op)
    order = [m for m in GROUPS if m in groups] + sorted(m for m in groups if m not in GROUPS)
    n_composite = sum(len(v) for v in groups.values())

    out = [INTRO]
    out.append(f"{len(leaves)} leaves, {len(atomic)} atomic ops, {n_composite} composite ops.\n")
    out.append("## Leaves\n")
    out += _table(leaves) + [""]
    out.append("## Atomic ops\n")
    out += _table(atomic) + [""]
    out.append("## Composite ops\n")
    for module in order:
        title = GROUPS.get(module, module.replace("_", " ").capitalize())
        out.append(f"### {title}\n")
        out.append(f"Defined in `tensor_graphs/ir/ops/{module.replace('.', '/')}.py`.\n")
        out += _table(sorted(groups[module], key=lambda op: op.name)) + [""]
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    return docgen.main(render, DOCS_PATH, COMMAND, __doc__.split("\n\n")[0], argv)


if __name__ == "__main__":
    sys.exit(main())
