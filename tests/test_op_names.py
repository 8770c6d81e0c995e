"""Op names are constants of the op table (tensor_graphs/ir/ops/names.py), never string literals:
``node.op.name == "matmull"`` compared False forever, ``node.op.name == MATMULL`` fails at
import or lint. These tests keep the table equal to the ops the package registers."""

from __future__ import annotations

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
