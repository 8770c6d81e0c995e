"""tg.load on hostile and careless files: every problem is a SerializationError that names the
file, found fast, before any node of the file is built wrongly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.errors import ShapeError
from tensor_graphs.ir.node import COMPOSITE, Node
from tensor_graphs.ir.ops import OPS
from tensor_graphs.ir.serialize import _REBUILD
from tensor_graphs.ir.shapes import as_dim, dim_symbol


def write(tmp_path, doc, name="hostile.json"):
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def graph_doc(tmp_path, outputs) -> dict:
    tg.save(outputs, tmp_path / "good.json")
    return json.loads((tmp_path / "good.json").read_text())


def refused(path, *fragments) -> str:
    with pytest.raises(tg.SerializationError) as info:
        tg.load(path)
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, message
    return message


def leaf_doc(tmp_path, shape) -> dict:
    """One input leaf whose shape attribute is ``shape`` (a list of JSON values)."""
    doc = graph_doc(tmp_path, tg.input("x", (2, 3)))
    doc["nodes"][0]["attrs"]["shape"] = shape
    del doc["nodes"][0]["shape"]
    return doc


# ------------------------------------------------------------------------ size expressions
ISSUE_EXPRESSIONS = ["9**9**9", "2**2**30", "batch*10**10000"]


@pytest.mark.parametrize("text", ISSUE_EXPRESSIONS)
def test_huge_powers_in_a_dim_fail_fast(tmp_path, text):
    tg.load(write(tmp_path, leaf_doc(tmp_path, [{"$dim": "batch"}, 4]), "warm.json"))
    path = write(tmp_path, leaf_doc(tmp_path, [{"$dim": text}, 4]))
    start = time.process_time()  # CPU time: other processes on the machine do not count
    message = refused(path, text, "node 0 (input)")
    assert time.process_time() - start < 0.1
    assert "size expression" in message


@pytest.mark.parametrize("text, why", [
    ("(9**9)**9", "larger than 2**62"),
    ("seq*" + "9" * 30, "not an integer from 0 to 2**62"),
    ("seq/0", "not finite"),
    ("Mod(seq, 0)", "cannot be computed"),
    ("seq**seq", "exponent"),
    ("(a+b+c)**16", "multiplies out to"),
    ("(a+b)*(c+d)*(e+f)*(g+h)*(i+j)*(k+l)*(m+n)", "multiplies out to"),
    ("Max(a, b, c, Min(d, e))", "Max and Min calls have 6 arguments"),
    ("+".join(["seq"] * 150), "numbers and operations"),
    ("seq" * 400, "characters long"),
    ("-" * 900 + "seq", "numbers and operations"),
    ("(" * 300 + "seq" + ")" * 300, "does not parse"),
    ("__import__('os').system('true')", "only names, integers"),
    ("seq.real", "only names, integers"),
    ("seq if seq else seq", "is not part of a size expression"),
    ("floor", "is a function, not a dim name"),
    ("floor(seq, 2)", "floor takes 1 to 1 arguments"),
    ("True", "not an integer"),
    ("1e5", "not an integer"),
    ("", "only names, integers"),
])
def test_dim_text_outside_the_grammar_or_bounds_is_refused(tmp_path, text, why):
    path = write(tmp_path, leaf_doc(tmp_path, [{"$dim": text}, 4]))
    start = time.process_time()
    refused(path, why)
    assert time.process_time() - start < 0.5
    with pytest.raises(ShapeError, match="size expression"):  # the builder's own parser
        as_dim(text)


def test_the_grammar_reads_every_form_the_encoder_writes(tmp_path):
    seq, batch = dim_symbol("seq"), dim_symbol("batch")
    import sympy

    for expr in (2 * seq, seq + 1, 3 - seq, batch * seq, seq ** 2, 1 / seq, seq ** -2,
                 sympy.floor(seq / 2), sympy.ceiling(seq / 2 - sympy.Rational(1, 2)),
                 sympy.Max(seq, batch + 1), sympy.Min(seq, 4), sympy.Mod(seq, 4),
                 2 ** 40 * seq):
        assert as_dim(str(expr)) == expr, expr
    assert as_dim("seq//2") == sympy.floor(seq / 2) and as_dim("seq % 3") == sympy.Mod(seq, 3)
    x = tg.input("x", ("batch", "seq"))
    y = tg.reshape(tg.pad(x, (0, 3)), (-1,))[: "floor(seq/2)"]
    tg.save(y, tmp_path / "g.json")
    assert tg.load(tmp_path / "g.json") is y


def test_tg_explain_refuses_a_huge_power_in_one_line(tmp_path):
    path = write(tmp_path, leaf_doc(tmp_path, [{"$dim": "9**9**9"}, 4]))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "tensor_graphs.cli", "explain", str(path),
                           "--db", ":memory:"], capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert str(path) in proc.stderr + proc.stdout and "9**9**9" in proc.stderr + proc.stdout


# ------------------------------------------------------------------ nodes validated at load
@pytest.mark.parametrize("dim, fragment", [
    (-3, "a dim must be >= 0"), (True, "not True"), (2.0, "not 2.0"), (2.5, "not 2.5"),
    ("seq", "attribute 'shape'"),  # a bare string, not {"$dim": ...}
])
def test_leaf_dims_are_checked_as_the_builder_checks_them(tmp_path, dim, fragment):
    refused(write(tmp_path, leaf_doc(tmp_path, [dim, 3])), "node 0 (input)", fragment)


def test_float_data_in_an_int8_constant_is_refused(tmp_path):
    doc = graph_doc(tmp_path, tg.constant(np.array([1, -2], np.int8)))
    doc["nodes"][0]["attrs"]["value"] = {"$array": "float32", "shape": [2], "data": [1.7, -2.2]}
    refused(write(tmp_path, doc), "node 0 (constant)", "float32 data [ 1.7, -2.2]",
            "int8 data [ 1, -2]")


def test_an_int8_constant_with_int8_data_loads(tmp_path):
    c = tg.constant(np.array([1, -2], np.int8))
    tg.save(c, tmp_path / "g.json")
    assert tg.load(tmp_path / "g.json") is c


def unary_doc(tmp_path, build, op: str) -> tuple[dict, dict]:
    """A file holding x (4, 6) and ``build(x)``; returns it and the attrs of its ``op`` node."""
    doc = graph_doc(tmp_path, build(tg.input("x", (4, 6))))
    record = next(r for r in doc["nodes"] if r["op"] == op)
    del record["shape"]
    for r in doc["nodes"]:
        r.pop("shape", None)
    return doc, record["attrs"]


@pytest.mark.parametrize("build, op, edit, fragment", [
    (lambda x: x[1:3], "slice", lambda a: a.update(stops=[9, 6]), "attribute 'stops'"),
    (lambda x: x[1:3], "slice", lambda a: a.update(starts=[7, 0]), "attribute 'starts'"),
    (lambda x: x[1:3], "slice", lambda a: a.update(steps=[0, 1]), "step must be a non-zero"),
    (lambda x: x[::-1], "slice", lambda a: a.update(stops=[-5, 6]), "attribute 'stops'"),
    (lambda x: tg.reshape(x, (24,)), "reshape", lambda a: a.update(shape=[-2, -12]),
     "a dim must be >= 0"),
    (lambda x: tg.reshape(x, (24,)), "reshape", lambda a: a.update(shape=[5, 5]),
     "cannot reshape"),
    (lambda x: tg.sum(x, 1), "sum", lambda a: a.update(axes=[2]), "out of range"),
    (lambda x: tg.sum(x, 1), "sum", lambda a: a.update(keepdims=1), "attribute 'keepdims'"),
    (lambda x: tg.permute(x, 1, 0), "permute", lambda a: a.update(perm=[1, 1]),
     "not a permutation"),
    (lambda x: tg.pad(x, (1, 2)), "pad", lambda a: a.update(pads=[[0, 0], [1, -2]]),
     "the builder gives it other inputs"),
    (lambda x: tg.concat([x, x], 1), "concat", lambda a: a.update(axis=-1), "attribute 'axis'"),
    (lambda x: tg.cast(x, "int32"), "cast", lambda a: a.update(dtype="int32"),
     "attribute 'dtype'"),
    (lambda x: tg.copy_to(x, "cpu"), "copy_to", lambda a: a.update(device=5),
     "attribute 'device'"),
    (lambda x: tg.reshape(x, (24,)), "reshape", lambda a: a.update(junk=1),
     "unknown attributes ['junk']"),
    (lambda x: tg.reshape(x, (24,)), "reshape", lambda a: a.clear(), "missing attributes"),
])
def test_atomic_nodes_are_rebuilt_through_the_builder(tmp_path, build, op, edit, fragment):
    doc, attrs = unary_doc(tmp_path, build, op)
    edit(attrs)
    refused(write(tmp_path, doc), f"({op})", fragment, "tg.save")


def test_a_leaf_dtype_must_be_a_dtype_and_constants_have_no_name(tmp_path):
    doc = graph_doc(tmp_path, tg.input("x", (2,)))
    doc["nodes"][0]["attrs"]["dtype"] = "float32"  # a bare string: the AttributeError of old
    refused(write(tmp_path, doc), "attribute 'dtype'")
    doc = graph_doc(tmp_path, tg.constant(np.array([1.0], np.float32)))
    doc["nodes"][0]["name"] = "c"
    refused(write(tmp_path, doc), "the name is 'c'")
    doc["nodes"][0].pop("name")
    doc["nodes"][0]["attrs"]["value"] = 3
    refused(write(tmp_path, doc), "attribute 'value'")


def test_a_node_the_builder_would_elide_still_loads(tmp_path):
    x = tg.input("x", (2, 3))
    same = Node.make(OPS["reshape"], (x,), {"shape": (2, 3)})  # a rewrite may make one
    tg.save(same, tmp_path / "g.json")
    assert tg.load(tmp_path / "g.json") is same
    doc = json.loads((tmp_path / "g.json").read_text())
    doc["nodes"][1]["attrs"]["shape"] = [2, "3"]
    del doc["nodes"][1]["shape"]
    refused(write(tmp_path, doc), "(reshape)", "hold text where sizes belong")


def test_every_leaf_and_atomic_op_has_a_rebuild():
    assert set(_REBUILD) == {name for name, op in OPS.items() if op.kind != COMPOSITE}


# ----------------------------------------------------------------------- unreadable files
def test_missing_file_directory_and_fifo(tmp_path):
    refused(tmp_path / "missing.json", "no such graph file")
    refused(tmp_path, "is a directory")
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    code = ("import sys, tensor_graphs as tg\ntry:\n    tg.load(sys.argv[1])\n"
            "except tg.SerializationError as exc:\n    print(exc)")
    proc = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert f"{fifo} is a FIFO (named pipe), not a regular file" in proc.stdout, proc.stderr


def test_a_path_that_is_not_a_path():
    with pytest.raises(tg.ArgumentError, match="expected the path of a graph file .* got int"):
        tg.load(0)  # open(0) would read standard input


def test_deep_json_and_huge_integers(tmp_path):
    refused(write(tmp_path, "[" * 100_000 + "]" * 100_000), "nested too deeply")
    refused(write(tmp_path, '{"format": ' + "9" * 5000 + "}"), "thousands of digits")
    doc = graph_doc(tmp_path, tg.input("x", (2,)))
    deep: list = [1]
    for _ in range(500):  # parses as JSON, but no attribute nests like this
        deep = [deep]
    doc["nodes"][0]["attrs"]["shape"] = deep
    refused(write(tmp_path, doc), "nested more than 32 levels")


@pytest.mark.parametrize("value, fragment", [
    ({"$float": []}, "unknown float"),
    ({"$dtype": {}}, "unknown dtype"),
    ({"$dim": ["seq"]}, "a dim must be written as a string"),
    ({"$array": [], "shape": [1], "data": [1]}, "unknown array dtype"),
])
def test_tagged_values_of_the_wrong_type(tmp_path, value, fragment):
    doc = graph_doc(tmp_path, tg.input("x", (2,)))
    doc["nodes"][0]["attrs"]["shape"] = [value]
    refused(write(tmp_path, doc), fragment)
