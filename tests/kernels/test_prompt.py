"""tg.kernels.prompt: a pattern's reference graph and the kernel signature, as text; and a
kernel written from a prompt's template loads."""

from __future__ import annotations

import textwrap

import pytest

import tensor_graphs as tg
from tensor_graphs.errors import ArgumentError
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.loading import parse_pattern


def test_prompt_for_an_op():
    text = tg.kernels.prompt("tanh")
    assert "# Write a tensor_graphs kernel for `tanh(x)`" in text
    assert "= tanh(%0) : (7, 33) float32" in text  # the reference graph, example signature
    assert "atomic ops" in text and "= exp(" in text and "`exp`: e**x" in text
    assert "@tg.kernel('tanh', backend='numpy', name='my_tanh')" in text
    assert "def my_tanh(x):" in text
    assert "x (1025,) float32" in text  # signatures it will be tried on
    assert "||got - ref|| / ||ref||" in text


def test_prompt_lists_attributes_and_optional_inputs():
    text = tg.kernels.prompt("layer_norm", name="fast_ln", backend="c")
    assert "def fast_ln(x, weight, bias, eps):" in text
    assert "backend='c'" in text and "`eps`" in text
    text = tg.kernels.prompt("lambda x: tg.layer_norm(x)")
    assert "def my_layer_norm(x, eps):" in text


def test_prompt_for_a_fused_expression():
    text = tg.kernels.prompt("gelu(x @ w + b)")
    assert "@tg.kernel(lambda x, w, b: tg.gelu(x @ w + b), backend='numpy'" in text
    assert "= matmul(%0, %1)" in text and "= erfc(" in text
    assert "x (7, 5) float32; w (5, 33) float32; b (33,) float32" in text


def test_prompt_for_a_kernel_name():
    text = tg.kernels.prompt("numpy_layer_norm_no_bias")
    assert "layer_norm(x, weight, args=('x', 'weight'))" in text


def test_parse_pattern_errors():
    with pytest.raises(ArgumentError, match="unknown function 'frobnicate'"):
        parse_pattern("frobnicate(x)")
    with pytest.raises(ArgumentError, match="not an op name"):
        parse_pattern("x +")
    with pytest.raises(ArgumentError, match="does not use any input"):
        parse_pattern("1 + 2")


def test_a_kernel_written_from_the_template_loads(tmp_path):
    text = tg.kernels.prompt("a * b + c", name="prompted_fma")
    header = next(line for line in text.splitlines() if line.startswith("@tg.kernel("))
    source = textwrap.dedent(f'''
        import numpy as np
        import tensor_graphs as tg

        {header}
        def prompted_fma(a, b, c):
            return a * b + c
    ''')
    path = tmp_path / "prompted.py"
    path.write_text(source)
    try:
        (k,) = tg.kernels.load(path)
        assert k.name == "prompted_fma" and tg.kernels.verify(k).ok
    finally:
        registry.unregister("prompted_fma")


def test_prompt_for_the_variadic_concat_asks_for_any_number_of_inputs(tmp_path):
    text = tg.kernels.prompt("concat", name="prompted_concat")
    assert "@tg.kernel('concat'" in text and "def prompted_concat(*xs, axis):" in text
    assert "`*xs` is variadic" in text
    header = next(line for line in text.splitlines() if line.startswith("@tg.kernel("))
    path = tmp_path / "concat.py"
    path.write_text(f"import numpy as np\nimport tensor_graphs as tg\n\n{header}\n"
                    "def prompted_concat(*xs, axis):\n"
                    "    return np.concatenate(xs, axis=axis)\n")
    try:
        (k,) = tg.kernels.load(path)
        assert k.inputs == ("xs",) and k.variadic == "xs" and k.attrs == ("axis",)
        parts = [tg.input(f"p{i}", (2, 3)) for i in range(6)]
        assert k.match(tg.concat(parts, axis=0)) is not None
    finally:
        registry.unregister("prompted_concat")
