"""tensor_graphs: write a tensor program as a graph, evaluate it exactly, run it fast.

    import tensor_graphs as tg
    x = tg.input("x", ("batch", 64))
    y = tg.gelu(x @ tg.weight("w", (64, 32))).sum(axis=-1)
    tg.evaluate(y, {"x": X, "w": W}, dtype="float64")
"""

# first: thread-pool settings must reach the environment before anything loads numpy's BLAS
from tensor_graphs import threads  # noqa: F401,I001
from tensor_graphs import kernels, nn, rewrite  # noqa: E402,F401  (tg.rewrite.apply, tg.nn.GPT2)
from tensor_graphs import optim  # noqa: E402,F401  (tg.optim.SGD, Adam, AdamW: steps over state)
from tensor_graphs.train import Trainer  # noqa: E402,F401  (tg.Trainer: loss, grad, step compiled)
from tensor_graphs.compiler import compile, count_paths, estimate_memory, paths  # noqa: F401,A004
from tensor_graphs.devices import Device  # noqa: E402,F401
from tensor_graphs.errors import (  # noqa: F401
    ArgumentError,
    CCompileError,
    ClusterError,
    DatabaseError,
    DecompositionError,
    DeviceError,
    DTypeError,
    EvaluationError,
    FeedError,
    GPUFaultError,
    KernelConstraintError,
    KernelVerificationError,
    NoPathError,
    OutOfMemory,
    PassError,
    PlanFileError,
    SerializationError,
    ShapeError,
    SignatureError,
    StateError,
    TensorGraphsError,
    UntrustedPathError,
)
from tensor_graphs.ir.api import *  # noqa: F401,F403
from tensor_graphs.ir.api import __all__ as _api_all
from tensor_graphs.ir.dtypes import (  # noqa: F401
    DType,
    bfloat16,
    bool_,
    float16,
    float32,
    float64,
    int8,
    int32,
    int64,
    uint8,
)
from tensor_graphs.ir.autodiff import grad  # noqa: F401  (reverse mode: tg.grad(loss, wrt))
from tensor_graphs.ir.evaluate import evaluate  # noqa: F401
from tensor_graphs.ir.graph import decompose, format_graph, nodes  # noqa: F401
from tensor_graphs.ir.node import Node, Op  # noqa: F401
from tensor_graphs.ir.serialize import load, save  # noqa: F401
from tensor_graphs.kernels.registry import kernel  # noqa: E402,F401
from tensor_graphs.rewrite import pattern as pat  # noqa: E402,F401  (tg.pat.var, ...)
from tensor_graphs.rewrite.canonical import (  # noqa: E402,F401
    canonical_hash,
    canonicalize,
    structural_hash,
)
from tensor_graphs.rewrite.quantize import quantize  # noqa: E402,F401  (op, or graph rewrite)
from tensor_graphs.runtime.prequantized import save_quantized  # noqa: E402,F401  (tg.save_quantized)
from tensor_graphs.rewrite.simplify import simplify  # noqa: E402,F401
from tensor_graphs.nn.quality import Quality, quality  # noqa: E402,F401,I001  (tg.quality)

__version__ = "0.1.0"


def from_torch(module, example_args, dynamic_shapes=None, **options):
    """A PyTorch module as a compiled program, called like the module (see
    ``tensor_graphs.frontend``). Imports torch only when called. ``train=True`` (with
    ``loss_fn=`` and ``optimizer=``) gives a ``tg.Trainer`` of the module's parameters instead
    (``tensor_graphs.train.torch_trainer``)."""
    if options.pop("train", False):
        from tensor_graphs.train.torch_trainer import trainer_from_torch

        return trainer_from_torch(module, example_args, dynamic_shapes=dynamic_shapes, **options)
    from tensor_graphs.frontend import from_torch as load

    return load(module, example_args, dynamic_shapes, **options)


def from_onnx(model, dynamic_dims=None, **options):
    """An ONNX model (path, bytes or ModelProto) as a compiled program, initializers bound
    (see ``tensor_graphs.frontend.onnx_import``). Imports onnx only when called."""
    from tensor_graphs.frontend.onnx_import import from_onnx as load

    return load(model, dynamic_dims, **options)


def generate(causal_lm, input_ids, max_new_tokens: int | None = None, stream: bool = False,
             **options):
    """Greedy decoding of a transformers causal LM with a KV cache in ``tg.state`` (see
    ``tensor_graphs.nn.generate``): ``max_new_tokens`` the call's, else the model's
    ``generation_config.max_new_tokens``, else 32."""
    from tensor_graphs.nn.generate import generate as run

    return run(causal_lm, input_ids, max_new_tokens, stream, **options)


__all__ = [
    *_api_all, "evaluate", "grad", "decompose", "format_graph", "nodes", "Node", "Op", "DType",
    "bool_", "uint8", "int8", "int32", "int64", "float16", "bfloat16", "float32", "float64",
    "save", "load", "rewrite", "pat", "canonicalize", "canonical_hash", "structural_hash",
    "simplify", "kernels", "kernel", "Device", "compile", "paths", "count_paths",
    "estimate_memory", "from_torch", "from_onnx", "generate", "quality", "Quality", "nn", "optim",
    "Trainer",
    "TensorGraphsError", "ArgumentError", "CCompileError", "ShapeError", "DTypeError", "FeedError",
    "DecompositionError", "DeviceError", "GPUFaultError", "KernelConstraintError",
    "KernelVerificationError",
    "StateError", "EvaluationError", "SerializationError", "DatabaseError", "ClusterError",
    "NoPathError",
    "OutOfMemory", "PassError", "PlanFileError", "UntrustedPathError", "SignatureError",
]
