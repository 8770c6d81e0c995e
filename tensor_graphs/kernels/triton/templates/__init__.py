"""Triton templates: hand-written GPU kernels for the patterns that dominate models.

- ``matmul``: linear and ``a @ b`` with the epilogue fused (bias, relu / gelu / gelu_tanh,
  + a residual of the result's shape), five tile configs each (two of them TF32 for fp32);
- ``attention``: flash attention (``scaled_dot_product_attention`` with and without a mask:
  causal, bool or float masks, grouped-query heads, the node's scale), online softmax in fp32;
  and a split-K decode attention for one query row over a long KV (partial softmax per split,
  then a combine kernel);
- ``rope``: ``rotary_embedding`` (Hugging Face's rotate_half layout, broadcast cos/sin);
- ``gather``: ``embedding`` (rows of a table by integer ids);
- ``argmax``: over the last axis, a long row (a vocabulary's logits) split over many programs,
  the last to finish picking the index (a decode step's token).

Each (template, config) is its own kernel, ``backend="triton"``, ``device="cuda"``, declared
``writes_out`` (``fn(*tensors, **attrs, out=view_or_None)`` returns its result: ``out``
itself when given). Kernels take torch tensors of any strides on the GPU (or, under the
simulated GPU, CPU tensors the Triton interpreter runs on: ``runtime.py``). They are
registered when triton is installed and a GPU, real or simulated, is usable (``usable`` of
``kernels/triton``, which the generated Triton kernels ask too); importing this
package imports neither triton nor torch (a template's jit module is imported on its first
call). ``compile_targets()`` lists every template x config for the ahead-of-time compile
(``targets.py``).
"""

from __future__ import annotations

from tensor_graphs.kernels.triton import usable


def compile_targets():
    """Every template x config to compile ahead of time, as ``aot.Target``s that
    ``aot.compile_target`` compiles (see ``targets.py``); imports triton."""
    from tensor_graphs.kernels.triton.templates.targets import compile_targets as targets

    return targets()


REGISTERED = usable()
if REGISTERED:
    from tensor_graphs.kernels.triton.templates import argmax as _argmax
    from tensor_graphs.kernels.triton.templates import attention as _attention
    from tensor_graphs.kernels.triton.templates import gather as _gather
    from tensor_graphs.kernels.triton.templates import matmul as _matmul
    from tensor_graphs.kernels.triton.templates import rope as _rope

    _matmul.register()
    _attention.register()
    _rope.register()
    _gather.register()
    _argmax.register()
