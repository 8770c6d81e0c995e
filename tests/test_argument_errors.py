"""Arguments the public API refuses with an error of its own (ArgumentError: a
TensorGraphsError naming the call, the value and what is expected), where a bare TypeError or
ValueError escaped from deep inside, or a wrong value was quietly taken: a compiled program
given to tg.quantize, bounds and ONNX dynamic_dims that are no positive int, explain's
limit, an optimizer's hyperparameters."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _graph():
    x = tg.input("x", ("b", 8))
    return (x @ tg.weight("w", (8, 4))).sum(axis=-1)


def _refused(call, *fragments):
    with pytest.raises(tg.ArgumentError) as info:
        call()
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)
    return str(info.value)


# ---------------------------------------------------------------------------- tg.quantize
@pytest.mark.parametrize("given, name", [
    (lambda: tg.compile(_graph(), bounds={"b": 4}), "CompiledGraph"),
    (lambda: None, "NoneType"),
    (lambda: 3, "int"),
])
def test_quantize_names_what_it_got_and_how_to_quantize_a_program(given, name):
    _refused(lambda: tg.quantize(given(), "int8-weight"), f"got {name}",
             "tg.compile(tg.quantize(y, 'int8-weight'), ...)")


# ---------------------------------------------------------------------------- backends
def test_an_unknown_backend_is_refused_by_name_and_a_lone_name_is_one_backend():
    """``backends=["cuda"]`` (a device's name) ended in a NoPathError that blamed the graph;
    ``backends="numpy"`` was read letter by letter."""
    said = _refused(lambda: tg.compile(_graph(), bounds={"b": 4}, backends=["cuda"]),
                    "unknown backend(s) ['cuda']", "device='cuda'")
    assert "'numpy'" in said and "'torch'" in said
    prog = tg.compile(_graph(), bounds={"b": 4}, backends="numpy")
    assert {s.kernel.backend for s in prog.plan.steps if not s.is_copy} == {"numpy"}


# ---------------------------------------------------------------------------- dims
BAD_DIMS = [-3, 0, "8", 8.5, None, True, 2 ** 63, np.float32(8)]


@pytest.mark.parametrize("value", BAD_DIMS)
def test_compile_bounds_must_be_positive_ints(value):
    _refused(lambda: tg.compile(_graph(), bounds={"b": value}), "tg.compile(bounds=...)",
             f"dim 'b' is {value!r}", "give its largest size as an int of 1 to 2**62")


def test_compile_bounds_take_numpy_ints_and_refuse_a_list():
    prog = tg.compile(_graph(), bounds={"b": np.int64(4)})
    prog.bind(w=np.ones((8, 4), np.float32))
    assert prog(x=np.ones((3, 8), np.float32)).tolist() == [32.0] * 3
    with pytest.raises(tg.ShapeError, match="above the bounds"):
        prog(x=np.ones((5, 8), np.float32))
    _refused(lambda: tg.compile(_graph(), bounds=[("b", 4)]), "expected a dict")


@pytest.mark.parametrize("value", [-3, "8", 2.5])
def test_dims_given_as_keywords_are_checked_too(value):
    _refused(lambda: tg.estimate_memory(_graph(), b=value), "tg.estimate_memory",
             f"dim 'b' is {value!r}")
    _refused(lambda: tg.count_paths(_graph(), b=value), "tg.count_paths")


def _onnx_model():
    w = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), w


@pytest.mark.parametrize("value", BAD_DIMS)
def test_onnx_dynamic_dims_must_be_positive_ints(value):
    m, _ = _onnx_model()
    _refused(lambda: tg.from_onnx(m, dynamic_dims={"n": value}),
             "from_onnx(dynamic_dims=...)", f"dim 'n' is {value!r}")


def test_onnx_dynamic_dims_of_the_wrong_kind_are_refused_before_reading_the_model():
    _refused(lambda: tg.from_onnx(b"not a model", dynamic_dims=["n"]),
             "from_onnx(dynamic_dims=...): expected a dict of dim name")


def test_onnx_dynamic_dims_still_bound_the_program():
    m, w = _onnx_model()
    prog = tg.from_onnx(m, dynamic_dims={"n": np.int32(4)})
    x = np.ones((3, 8), np.float32)
    np.testing.assert_allclose(prog(x=x)[0], x @ w, rtol=1e-5)
    with pytest.raises(tg.ShapeError, match="dynamic_dims gave 4"):
        prog(x=np.ones((5, 8), np.float32))


# ---------------------------------------------------------------------------- explain
@pytest.fixture(scope="module")
def program():
    return tg.compile(_graph(), bounds={"b": 4})


@pytest.mark.parametrize("limit", ["3", -1, 1.5, True])
def test_explain_limit_is_a_count(program, limit):
    _refused(lambda: program.explain(limit=limit), f"explain(limit={limit!r})",
             "an int >= 0, or None")


def test_explain_limit_counts_the_steps_left(program):
    steps = len(program.plan.steps)
    assert f"... {steps} more steps" in program.explain(limit=0)
    assert "more steps" not in program.explain(limit=steps)
    assert "more steps" not in program.explain(limit=np.int64(steps + 5))


# ---------------------------------------------------------------------------- optimizers
@pytest.mark.parametrize("build, words", [
    (lambda: tg.optim.Adam(1e-3, betas=(0.9,)), "betas must be a pair (beta1, beta2)"),
    (lambda: tg.optim.Adam(1e-3, betas=None), "betas must be a pair"),
    (lambda: tg.optim.AdamW(1e-3, betas=(0.9, 0.99, 0.9)), "AdamW: betas must be a pair"),
    (lambda: tg.optim.Adam(1e-3, betas=("a", 0.9)), "invalid beta at index 0: 'a'"),
    (lambda: tg.optim.Adam(1e-3, eps="1e-8"), "Adam: invalid eps '1e-8'"),
    (lambda: tg.optim.Adam(1e-3, weight_decay=None), "invalid weight_decay None"),
    (lambda: tg.optim.Adam(1e-3, amsgrad="yes"), "amsgrad must be True or False"),
    (lambda: tg.optim.AdamW(1e-3, maximize=1), "maximize must be True or False"),
    (lambda: tg.optim.Adam(True), "invalid learning rate True"),
    (lambda: tg.optim.Adam(1e-3, prefix=None), "prefix must be a str"),
    (lambda: tg.optim.SGD(0.1, momentum="0.9"), "SGD: invalid momentum '0.9'"),
    (lambda: tg.optim.SGD(0.1, weight_decay=float("nan")), "invalid weight_decay nan"),
    (lambda: tg.optim.SGD(0.1, momentum=0.9, dampening=None), "invalid dampening None"),
    (lambda: tg.optim.SGD(0.1, momentum=0.9, nesterov="no"), "nesterov must be True or"),
])
def test_optimizer_arguments_are_refused_by_name(build, words):
    _refused(build, words)


def test_optimizers_take_numpy_numbers():
    opt = tg.optim.Adam(np.float32(1e-3), betas=np.array([0.8, 0.9]), eps=np.float64(1e-6))
    assert opt.betas == (0.8, 0.9) and opt.eps == 1e-6
    sgd = tg.optim.SGD(np.int64(1), momentum=np.float32(0.5), nesterov=np.bool_(True))
    assert sgd.lr == 1.0 and sgd.momentum == 0.5 and sgd.nesterov is True
