"""What Triton 3.6 (the GPU machine's) refuses and 3.9 (CI's) compiles: CI compiles with 3.9
only, so these rules are checked on the templates' source. Under 3.6 a string is a constexpr
only as a kernel's argument or a literal at a call: a ``@triton.jit`` helper's string default
fails every kernel that leaves it out ("'str' object has no attribute 'type'": gemv_split,
gemv_combine and the chain failed to compile there so), as does a string inside a constexpr
tuple (``test_chain.py`` checks the chain's)."""

from __future__ import annotations

import ast
from pathlib import Path

import tensor_graphs.kernels.triton.templates as templates

JIT_MODULES = sorted(Path(templates.__file__).parent.glob("*_jit.py"))


def _jitted(tree: ast.Module):
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any(
                "jit" in ast.unparse(d) for d in node.decorator_list):
            yield node


def test_no_jit_function_has_a_string_default():
    assert len(JIT_MODULES) >= 5
    found = []
    for path in JIT_MODULES:
        for fn in _jitted(ast.parse(path.read_text())):
            args = fn.args.posonlyargs + fn.args.args
            for arg, default in zip(args[len(args) - len(fn.args.defaults):],
                                    fn.args.defaults):
                if isinstance(default, ast.Constant) and isinstance(default.value, str):
                    found.append(f"{path.name}: {fn.name}({arg.arg}={default.value!r})")
    assert not found, found
