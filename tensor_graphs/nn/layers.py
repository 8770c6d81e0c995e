"""Layers with weights: Linear, Embedding, LayerNorm, RMSNorm, MLP.

A layer is a small object holding its sizes and the name prefix of its weights; calling it on
nodes builds graph nodes (``tg.nn.Linear(768, 3072, name="h.0.mlp.c_fc")(x)``). Weight leaves
are named ``f"{name}.weight"`` / ``f"{name}.bias"`` like a transformers state dict, so
``prog.bind_safetensors(path)`` binds a checkpoint by name. Leaves are hash-consed: building a
layer twice, or two layers with one name (tied embeddings), gives the same weight node.
"""

from __future__ import annotations

from tensor_graphs.errors import ArgumentError
from tensor_graphs.ir import api as tg
from tensor_graphs.ir.node import Node

__all__ = ["Linear", "Embedding", "LayerNorm", "RMSNorm", "MLP", "ACTIVATIONS",
           "check_activation"]


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


class Linear:
    """``x @ W.T + b`` with ``W`` of shape (out, in), as torch.nn.Linear.

    ``transposed=True`` stores the weight as (in, out) and computes ``x @ W + b``: the layout of
    transformers' ``Conv1D`` (GPT-2's c_attn, c_proj, c_fc). The graph reads the checkpoint's
    tensor as it is (no transpose, no copy at bind time).
    """

    def __init__(self, in_features: int, out_features: int, *, name: str, bias: bool = True,
                 transposed: bool = False, dtype: str = "float32"):
        self.in_features, self.out_features = in_features, out_features
        self.name, self.transposed = name, transposed
        shape = (in_features, out_features) if transposed else (out_features, in_features)
        self.weight = tg.weight(_join(name, "weight"), shape, dtype)
        self.bias = tg.weight(_join(name, "bias"), (out_features,), dtype) if bias else None

    def __call__(self, x: Node) -> Node:
        if not self.transposed:
            return tg.linear(x, self.weight, self.bias)
        y = tg.matmul(x, self.weight)
        return y if self.bias is None else y + self.bias

    def __repr__(self) -> str:
        return (f"Linear({self.in_features}, {self.out_features}, name={self.name!r}, "
                f"bias={self.bias is not None}, transposed={self.transposed})")


class Embedding:
    """Rows of a (num_embeddings, dim) table picked by integer ids."""

    def __init__(self, num_embeddings: int, dim: int, *, name: str, dtype: str = "float32"):
        self.num_embeddings, self.dim, self.name = num_embeddings, dim, name
        self.weight = tg.weight(_join(name, "weight"), (num_embeddings, dim), dtype)

    def __call__(self, ids: Node) -> Node:
        return tg.embedding(ids, self.weight)

    def attend(self, x: Node) -> Node:
        """Logits against the table (a tied LM head): ``x @ weight.T``."""
        return tg.linear(x, self.weight)

    def __repr__(self) -> str:
        return f"Embedding({self.num_embeddings}, {self.dim}, name={self.name!r})"


class LayerNorm:
    """Layer norm over the last axis with a weight and (optionally) a bias."""

    def __init__(self, dim: int, *, name: str, eps: float = 1e-5, bias: bool = True,
                 dtype: str = "float32"):
        self.dim, self.name, self.eps = dim, name, eps
        self.weight = tg.weight(_join(name, "weight"), (dim,), dtype)
        self.bias = tg.weight(_join(name, "bias"), (dim,), dtype) if bias else None

    def __call__(self, x: Node) -> Node:
        return tg.layer_norm(x, self.weight, self.bias, eps=self.eps)

    def __repr__(self) -> str:
        return f"LayerNorm({self.dim}, name={self.name!r}, eps={self.eps})"


class RMSNorm:
    """RMS norm over the last axis with a weight (Llama, Qwen; also Qwen3's per-head q/k norm)."""

    def __init__(self, dim: int, *, name: str, eps: float = 1e-6, dtype: str = "float32"):
        self.dim, self.name, self.eps = dim, name, eps
        self.weight = tg.weight(_join(name, "weight"), (dim,), dtype)

    def __call__(self, x: Node) -> Node:
        return tg.rms_norm(x, self.weight, eps=self.eps)

    def __repr__(self) -> str:
        return f"RMSNorm({self.dim}, name={self.name!r}, eps={self.eps})"


def _gelu_tanh(x: Node) -> Node:
    return tg.gelu(x, approximate="tanh")


#: activation name (transformers' ``hidden_act`` / ``activation_function`` spelling, its
#: ``ACT2FN`` keys) -> builder. Several names are one function written differently there
#: (``gelu_fast``, ``gelu_accurate`` and ``gelu_new`` all GELU's tanh form): built once, as
#: the same function up to rounding. Those with learned parameters (``prelu``, ``xielu``) are
#: not built.
ACTIVATIONS = {
    "gelu": tg.gelu,
    "gelu_python": tg.gelu,
    "gelu_10": lambda x: tg.clamp(tg.gelu(x), min=-10.0, max=10.0),  # ClippedGELU(-10, 10)
    "gelu_new": _gelu_tanh,  # GPT-2
    "gelu_pytorch_tanh": _gelu_tanh,
    "gelu_python_tanh": _gelu_tanh,
    "gelu_fast": _gelu_tanh,
    "gelu_accurate": _gelu_tanh,
    "quick_gelu": lambda x: x * tg.sigmoid(x * 1.702),
    "relu": tg.relu,
    "relu2": lambda x: tg.square(tg.relu(x)),
    "relu6": lambda x: tg.clamp(x, min=0.0, max=6.0),
    "silu": tg.silu,
    "swish": tg.silu,
    "sigmoid": tg.sigmoid,
    "tanh": tg.tanh,
    "linear": lambda x: x,
}


def check_activation(name, where: str, setting: str) -> str:
    """``name`` if ``ACTIVATIONS`` builds it, else an ArgumentError naming the config's
    ``setting`` (``hidden_act``...) and those built: the MLP's own refusal, raised later when
    the model is built, named neither the setting nor where it came from."""
    if name not in ACTIVATIONS:
        raise ArgumentError(f"{where}: {setting}={name!r} is not built (built: "
                            f"{', '.join(sorted(ACTIVATIONS))}); tg.from_torch(model, ...) may "
                            "import this model for single forward passes")
    return name


class MLP:
    """The feed-forward block: ``down(act(up(x)))``, or gated ``down(act(gate(x)) * up(x))``.

    Sublayer names default to the transformers checkpoints of each kind: plain (GPT-2)
    ``c_fc``/``c_proj``; gated (Llama SwiGLU) ``gate_proj``/``up_proj``/``down_proj``. Pass
    ``names`` to use others (e.g. ``("fc1", "fc2")``). ``transposed`` as in :class:`Linear`.
    """

    def __init__(self, dim: int, hidden: int, *, name: str, activation: str = "gelu",
                 gated: bool = False, bias: bool = True, transposed: bool = False,
                 names: tuple[str, ...] | None = None, dtype: str = "float32"):
        if activation not in ACTIVATIONS:
            raise ArgumentError(f"MLP: unknown activation {activation!r}; known: "
                                f"{sorted(ACTIVATIONS)}")
        names = names or (("gate_proj", "up_proj", "down_proj") if gated else ("c_fc", "c_proj"))
        if len(names) != (3 if gated else 2):
            raise ArgumentError(f"MLP: names must be (gate, up, down) when gated, else (up, "
                                f"down); got {names!r}")
        self.name, self.activation, self.gated = name, activation, gated

        def proj(sub, n_in, n_out):
            return Linear(n_in, n_out, name=_join(name, sub), bias=bias, transposed=transposed,
                          dtype=dtype)

        self.gate = proj(names[0], dim, hidden) if gated else None
        self.up = proj(names[-2], dim, hidden)
        self.down = proj(names[-1], hidden, dim)

    def __call__(self, x: Node) -> Node:
        act = ACTIVATIONS[self.activation]
        h = act(self.gate(x)) * self.up(x) if self.gated else act(self.up(x))
        return self.down(h)

    def __repr__(self) -> str:
        kind = "gated " if self.gated else ""
        return f"MLP({kind}{self.activation}, name={self.name!r})"
