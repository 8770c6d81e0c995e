"""Op names are constants of the op table (tensor_graphs/ir/ops/names.py), never string literals:
``node.op.name == "matmull"`` compared False forever, ``node.op.name == MATMULL`` fails at
import or lint. The first tests keep the table equal to the ops the package registers; the last
refuse a string literal compared with an op's name anywhere in tensor_graphs/."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tensor_graphs.ir.ops import OPS, names

PACKAGE = Path(__file__).resolve().parents[1] / "tensor_graphs"
CONSTANTS = {k: v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)}


def _built_in_ops() -> list[str]:
    """The ops ``import tensor_graphs`` registers, from a fresh interpreter (this one may hold
    ops that other tests registered)."""
    code = ("import json, tensor_graphs; from tensor_graphs.ir.ops import OPS; "
            "print(json.dumps(sorted(OPS)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=PACKAGE.parent)
    return json.loads(done.stdout)


def test_every_constant_names_a_registered_op_and_every_op_has_one():
    assert CONSTANTS, "names.py defines no constants"
    wrong = {k: v for k, v in CONSTANTS.items() if k != v.upper()}
    assert not wrong, f"constants not spelt as their op's name in capitals: {wrong}"
    built_in = _built_in_ops()
    unknown = sorted(v for v in CONSTANTS.values() if v not in built_in)
    assert not unknown, (f"tensor_graphs/ir/ops/names.py names ops that are not registered: "
                         f"{unknown}; correct the spelling or remove the line")
    missing = sorted(set(built_in) - set(CONSTANTS.values()))
    assert not missing, (f"ops registered without a constant in tensor_graphs/ir/ops/names.py: "
                         f"{missing}; add e.g. {missing[0].upper()} = {missing[0]!r}")


def test_the_constants_are_the_names_in_this_process_too():
    assert all(v in OPS and OPS[v].name == v for v in CONSTANTS.values())


def test_a_misspelt_constant_fails_at_import():
    with pytest.raises(ImportError):
        exec("from tensor_graphs.ir.ops.names import MATMULL", {})


def test_every_verification_generator_is_for_an_op():
    """``signatures.generator("exp", ...)`` registers by name; a misspelt one gave no cases."""
    from tensor_graphs.kernels.signatures import GENERATORS

    assert sorted(set(GENERATORS) - set(OPS)) == []


# ------------------------------------------------------------------- no literal op names
# A variable of one of these names compared with a string that names an op is taken for an op's
# name (codegen's ``name = n.op.name``, the interpreter's ``kind = node.op.name``).
VARIABLES = ("op", "op_name", "name", "kind")

# Literal comparisons left where they are, one line per file: these files' bytes are part of
# kernel source hashes (kernels/numpy/exact.py digests itself and the file defining each op), so
# editing them makes every stored measurement of those kernels stale; they change with the
# next edit made for a reason of its own. (exact.py's ``name == "state"`` is a parameter name.)
KEPT = {
    "tensor_graphs/ir/ops/atomic.py": {"sum", "max", "state", "state_update"},
    "tensor_graphs/kernels/numpy/exact.py": {"state_update", "state", "copy_to"},
}


def _names_an_op(node: ast.expr) -> bool:
    """``<x>.op.name`` or ``op.name`` (an Op's name), ``<x>.op`` (a pattern's op, a string),
    or a variable in VARIABLES."""
    if isinstance(node, ast.Attribute):
        if node.attr == "op":
            return True
        inner = node.value
        return node.attr == "name" and (isinstance(inner, ast.Attribute) and inner.attr == "op"
                                        or isinstance(inner, ast.Name) and inner.id == "op")
    return isinstance(node, ast.Name) and node.id in VARIABLES


def _literal_op_names(node: ast.expr) -> list[str]:
    """The op names spelt as string literals in a comparison operand (a string, or a tuple,
    list or set of them)."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [i.value for i in items
            if isinstance(i, ast.Constant) and isinstance(i.value, str) and i.value in OPS]


def literal_comparisons(source: str) -> list[tuple[int, str]]:
    """(line, op name) of every comparison of an op's name with a string literal."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        if any(_names_an_op(o) for o in operands):
            found += [(node.lineno, n) for o in operands for n in _literal_op_names(o)]
    return sorted(found)


def test_the_check_sees_the_forms_it_refuses():
    source = ("a = n.op.name == 'matmul'\nb = n.op.name in ('weight', 'constant')\n"
              "c = 'permute' != x.inputs[0].op.name\nd = op == 'copy_to'\ne = p.op == 'where'\n"
              "f = kind == 'dim'\ng = n.op.name == MATMUL\nh = mode == 'constant'\n"
              "i = d.name == 'float32'\nj = s.kind.name == 'input'\n")
    assert literal_comparisons(source) == [(1, "matmul"), (2, "constant"), (2, "weight"),
                                           (3, "permute"), (4, "copy_to"), (5, "where"),
                                           (6, "dim")]


def test_no_module_compares_an_op_name_with_a_string_literal():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        found += [f"{rel}:{line}: {name!r}" for line, name in literal_comparisons(path.read_text())
                  if name not in KEPT.get(rel, ())]
    assert not found, ("op names compared as string literals; compare with the constants of "
                       "tensor_graphs/ir/ops/names.py (from tensor_graphs.ir.ops.names import "
                       "MATMUL):\n" + "\n".join(found))
