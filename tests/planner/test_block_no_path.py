"""A repeated block with no path within the tolerance names the op inside it that has none
and the tolerance that op needs, as a graph without repeated blocks does (a float16 Llama
at 1e-5 said "no kernel on cpu computes input() -> (2, 12, 64) float16": the block's input
placeholder, which its sub-planner feeds and never computes)."""

import pytest

import tensor_graphs as tg


def _layers(n: int):
    x = tg.input("x", (2, 12, 64), "float16")
    for i in range(n):
        w = tg.weight(f"w{i}", (64, 64), "float16")
        g = tg.weight(f"g{i}", (64,), "float16")
        x = x + tg.mul(g, tg.tanh(tg.matmul(x, w)))
    return x


def test_a_repeated_block_without_a_path_names_its_op_and_the_tolerance_it_needs():
    y = _layers(3)
    assert tg.compile(y, db=":memory:", tolerance=1e-2).stats["blocks"] == 3  # blocks found
    with pytest.raises(tg.NoPathError) as blocked:
        tg.compile(y, db=":memory:", tolerance=1e-5)
    with pytest.raises(tg.NoPathError) as flat:  # one layer: no repeated block
        tg.compile(_layers(1), db=":memory:", tolerance=1e-5)
    message = str(blocked.value)
    assert "input()" not in message
    assert message.startswith("no path computes matmul((2, 12, 64) float16, (64, 64) "
                              "float16) -> (2, 12, 64) float16 within tolerance 1e-05")
    assert "use tolerance >= 9.8e-04" in message
    assert message == str(flat.value)
