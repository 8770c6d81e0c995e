"""Binding weights again replaces them, everywhere they were used: the bound values, what the
prelude made from them (a transposed weight, packed GEMM panels) and the native loop's
recordings, which hold their addresses. A binding that does not fit changes nothing."""

import numpy as np
import pytest
import safetensors.numpy as stn

import tensor_graphs as tg
from tensor_graphs.db.store import Measurement, open_db
from tensor_graphs.kernels import registry
from tensor_graphs.planner.search import signature

SHAPES = {"w": (32, 48), "b": (48,), "e": (16, 48)}


def checkpoint(tmp_path, name, seed, **override):
    """A real safetensors file (written by the ``safetensors`` package) and its arrays."""
    rng = np.random.default_rng(seed)
    arrays = {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}
    arrays.update(override)
    path = tmp_path / f"{name}.safetensors"
    stn.save_file(arrays, str(path))
    return path, arrays


def graph():
    x = tg.input("x", (8, 32))
    w, b, e = (tg.weight(n, s) for n, s in SHAPES.items())
    y = tg.relu(x @ w + b) @ e.T  # e.T: a prelude result, made once per binding
    return [x, w, b], y


def compiled(backend):
    """The graph compiled on C kernels with both GEMMs on packed weights (the database says
    they are fastest; one packs a weight, the other the prelude's transposed ``e``), or on
    numpy kernels (the Python loop only)."""
    first, y = graph()
    if backend == "numpy":
        return y, tg.compile(y, db=":memory:", backends=("numpy",))
    db = open_db(":memory:")
    for name, args in {"c_packed_matmul_bias_relu": first,
                       "c_packed_matmul": list(y.inputs)}.items():
        k = registry.get(name)
        db.record(Measurement(name, k.source_hash, signature(args, {}), 5, 1e-9, 1e-9, 1e-9,
                              1e-8))
    prog = tg.compile(y, db=db)
    assert {"c_packed_matmul_bias_relu", "c_packed_matmul"} <= set(prog.plan.kernels), \
        prog.explain()
    return y, prog


def reference(y, x, weights):
    return tg.evaluate(y, {"x": x, **weights}, dtype="float64")


def check(got, y, x, weights):
    np.testing.assert_allclose(got, reference(y, x, weights), rtol=1e-4, atol=1e-3)


X = np.random.default_rng(9).standard_normal((8, 32)).astype(np.float32)


def run_until_native(prog, y, x, weights):
    """Call 3 times with the same dims: the prelude runs, the native loop records, replays."""
    for _ in range(3):
        check(prog(x=x), y, x, weights)
    return prog.loop


@pytest.mark.parametrize("backend", ["c", "numpy"])
def test_second_checkpoint_replaces_the_first(tmp_path, backend):
    y, prog = compiled(backend)
    first, A = checkpoint(tmp_path, "a", 0)
    second, B = checkpoint(tmp_path, "b", 1)
    prog.bind_safetensors(first)
    loop = run_until_native(prog, y, X, A)
    assert loop.startswith("native loop" if backend == "c" else "python loop"), loop

    prog.bind_safetensors(second)
    got = prog(x=X)
    assert "prelude runs" in prog.loop  # the packed and transposed weights are made again
    check(got, y, X, B)
    assert not np.allclose(got, reference(y, X, A), atol=1e-2)
    loop = run_until_native(prog, y, X, B)  # recorded again, on the new buffers
    assert loop.startswith("native loop" if backend == "c" else "python loop"), loop
    check(prog(x=X), y, X, B)


def test_bind_with_arrays_replaces_the_same_way(tmp_path):
    y, prog = compiled("c")
    _, A = checkpoint(tmp_path, "a", 0)
    _, B = checkpoint(tmp_path, "b", 1)
    prog.bind(**A)
    assert run_until_native(prog, y, X, A).startswith("native loop")
    prog.bind(w=B["w"])  # one weight: the others stay
    check(prog(x=X), y, X, {**A, "w": B["w"]})
    assert run_until_native(prog, y, X, {**A, "w": B["w"]}).startswith("native loop")


def test_a_file_with_part_of_the_weights_replaces_those(tmp_path):
    y, prog = compiled("c")
    first, A = checkpoint(tmp_path, "a", 0)
    prog.bind_safetensors(first)
    run_until_native(prog, y, X, A)
    E = np.full(SHAPES["e"], 0.5, np.float32)
    part = tmp_path / "e_only.safetensors"
    stn.save_file({"e": E}, str(part))
    prog.bind_safetensors(part)  # w and b are bound already: kept
    run_until_native(prog, y, X, {**A, "e": E})

    fresh = compiled("c")[1]  # nothing bound: the file lacks w and b
    with pytest.raises(tg.FeedError, match=r"no tensor for 2 weight\(s\): 'w', 'b'"):
        fresh.bind_safetensors(part)


@pytest.mark.parametrize("bad, error, match", [
    ({"w": np.ones((48, 32), np.float32)}, tg.ShapeError,
     r"'w' is \[48, 32\] in the file, \[32, 48\] in the graph"),
    ({"b": np.ones((48, 1), np.float32)}, tg.ShapeError, r"'b' is \[48, 1\] in the file"),
    ({"e": np.ones(SHAPES["e"], np.int32)}, tg.DTypeError, r"'e' is I32 in the file, float32"),
])
def test_a_file_that_does_not_fit_changes_nothing(tmp_path, bad, error, match):
    """Every tensor of the file is checked before one is bound: the good ones of a bad file
    are not bound either, and the native recording of the old weights stays in use."""
    y, prog = compiled("c")
    first, A = checkpoint(tmp_path, "a", 0)
    wrong, _ = checkpoint(tmp_path, "wrong", 1, **bad)
    prog.bind_safetensors(first)
    run_until_native(prog, y, X, A)
    with pytest.raises(error, match=match) as exc:
        prog.bind_safetensors(wrong)
    assert str(wrong) in str(exc.value)
    check(prog(x=X), y, X, A)
    assert prog.loop.startswith("native loop"), prog.loop


def test_bind_checks_every_array_before_binding_one(tmp_path):
    y, prog = compiled("c")
    _, A = checkpoint(tmp_path, "a", 0)
    _, B = checkpoint(tmp_path, "b", 1)
    prog.bind(**A)
    run_until_native(prog, y, X, A)
    with pytest.raises(tg.ShapeError, match=r"bind: weight 'b' has shape \(47,\)"):
        prog.bind(w=B["w"], b=np.ones(47, np.float32))  # w alone would fit
    with pytest.raises(tg.DTypeError, match="'e'"):
        prog.bind(w=B["w"], e=np.ones(SHAPES["e"], np.int64))
    check(prog(x=X), y, X, A)
    assert prog.loop.startswith("native loop"), prog.loop
    prog.bind(b=A["b"])  # made again from what is bound: still none of B
    check(prog(x=X), y, X, A)


def test_weights_with_symbolic_shapes_bind_from_a_file(tmp_path):
    """A weight's symbolic dims take the file's sizes, bound across the file's tensors as a
    call binds them across its feeds."""
    x = tg.input("x", ("n", 3))
    y = x * tg.weight("w", ("n", 3)) + tg.weight("v", ("n", 1))
    prog = tg.compile(y, db=":memory:")
    W, V = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((2, 1), np.float32)
    stn.save_file({"w": W, "v": V}, str(tmp_path / "wv.safetensors"))
    prog.bind_safetensors(tmp_path / "wv.safetensors")
    X = np.full((2, 3), 2, np.float32)
    np.testing.assert_array_equal(prog(x=X), X * W + V)
    with pytest.raises(tg.ShapeError, match="dim 'n'"):
        prog(x=np.ones((4, 3), np.float32))

    stn.save_file({"w": np.ones((4, 3), np.float32), "v": np.ones((5, 1), np.float32)},
                  str(tmp_path / "disagree.safetensors"))
    with pytest.raises(tg.ShapeError, match=r"disagree.safetensors.*dim 'n'"):
        prog.bind_safetensors(tmp_path / "disagree.safetensors")
    np.testing.assert_array_equal(prog(x=X), X * W + V)  # unchanged


def test_a_sharded_checkpoint_binds_from_its_folder_or_index(tmp_path):
    """A save_pretrained folder (or its index) holds a large model's weights in shards: a
    shard alone lacked the others' weights and the folder was refused as no file."""
    import json

    y, prog = compiled("numpy")
    _, A = checkpoint(tmp_path, "a", 0)
    folder = tmp_path / "sharded"
    folder.mkdir()
    shards = {"model-1.safetensors": {"model.w": A["w"], "model.b": A["b"]},
              "model-2.safetensors": {"model.e": A["e"]}}
    for file, arrays in shards.items():
        stn.save_file(arrays, str(folder / file))
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {n: f for f, a in shards.items() for n in a}}))
    strip = {f"model.{n}": n for n in SHAPES}
    for path in (folder, index):
        fresh = compiled("numpy")[1]
        fresh.bind_safetensors(path, rename=strip, strict=True)
        check(fresh(x=X), y, X, A)
    with pytest.raises(tg.FeedError, match=r"maps no shard to 3 weight\(s\): 'w', 'b', 'e'"):
        prog.bind_safetensors(folder)  # no rename: the names are the file's
    prog.bind(e=A["e"])  # bound: the checkpoint may lack it, but strict refuses what is left
    with pytest.raises(tg.FeedError, match=r"maps 1 tensor\(s\) no weight of the graph wants "
                       r"\(strict=True\): 'model.e'"):
        prog.bind_safetensors(folder, rename={"model.w": "w", "model.b": "b", "model.e": "e2"},
                              strict=True)


def test_a_host_array_of_the_weights_dtype_is_held_not_copied(tmp_path):
    """As ``bind`` documents: a C-contiguous array of the weight's dtype is held as it is (no
    second host copy of the model), so one changed in place is taken whole only once bound
    again; an array of another dtype is converted, a copy the caller's changes never reach."""
    y, prog = compiled("c")
    _, A = checkpoint(tmp_path, "a", 0)
    _, B = checkpoint(tmp_path, "b", 1)
    held = {n: a.copy() for n, a in A.items()}
    prog.bind(**held)
    run_until_native(prog, y, X, A)
    assert all(np.shares_memory(prog.bound_weights([n])[n], held[n]) for n in held)
    for n in held:
        held[n][...] = B[n]  # in place: the packed and transposed copies still hold A
    prog.bind(**held)  # the same arrays again: everything derived from them is made anew
    check(prog(x=X), y, X, B)
    assert run_until_native(prog, y, X, B).startswith("native loop")
    wide = A["w"].astype(np.float64)
    prog.bind(w=wide)
    assert not np.shares_memory(prog.bound_weights(["w"])["w"], wide)
    wide[...] = 0
    check(prog(x=X), y, X, {**B, "w": A["w"]})
