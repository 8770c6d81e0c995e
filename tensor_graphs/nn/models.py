"""Decoder-only language models built from the layers: a GPT-2 and a Llama (Qwen3) style one.

Weight names are transformers' state-dict keys (``transformer.h.0.attn.c_attn.weight``,
``model.layers.0.self_attn.q_proj.weight``, ...), so a checkpoint written from the transformers
model binds with ``prog.bind_safetensors(path)``. The one layout difference is GPT-2's Conv1D,
whose weights are stored (in, out): those projections compute ``x @ W`` on the stored tensor
(``Linear(transposed=True)``), so nothing is transposed or copied. GPT-2's LM head is the token
embedding (tied): the graph reads ``transformer.wte.weight`` and ignores the file's duplicate
``lm_head.weight``.

``model(ids, cache=None)`` builds the logits (batch, seq, vocab) for int64 ``input_ids`` of
shape (batch, seq), both symbolic by default. The configs are plain dataclasses;
``from_hf(config)`` reads a transformers config object (duck-typed: no import of transformers).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from tensor_graphs.errors import ArgumentError, ShapeError
from tensor_graphs.ir import api as tg
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.shapes import format_shape
from tensor_graphs.nn.attention import KVCache, MultiHeadAttention, RopeScaling, positions
from tensor_graphs.nn.layers import (
    MLP,
    Embedding,
    LayerNorm,
    Linear,
    RMSNorm,
    _join,
    check_activation,
)

__all__ = ["TransformerBlock", "GPT2Config", "GPT2", "LlamaConfig", "Llama", "input_ids"]


def input_ids(name: str = "input_ids", batch="batch", seq="seq") -> Node:
    """The token ids input, (batch, seq) int64, symbolic unless given ints."""
    return tg.input(name, (batch, seq), "int64")


class TransformerBlock:
    """Pre-norm residual block: ``x + attn(norm1(x))``, then ``+ mlp(norm2(x))``."""

    def __init__(self, attn: MultiHeadAttention, mlp: MLP, norm1, norm2):
        self.attn, self.mlp, self.norm1, self.norm2 = attn, mlp, norm1, norm2

    def __call__(self, x: Node, *, cache: KVCache | None = None, pad: Node | None = None
                 ) -> Node:
        x = x + self.attn(self.norm1(x), cache=cache, pad=pad)
        return x + self.mlp(self.norm2(x))

    def __repr__(self) -> str:
        return f"TransformerBlock({self.attn!r}, {self.mlp!r})"


def _last(x: Node) -> Node:
    """The last position of (batch, seq, dim): generation needs only its logits, and the LM
    head over every position is most of a prefill's work for a large vocabulary."""
    seq = x.shape[1]
    return tg.slice_axis(x, 1, seq - 1, seq)


def _check_ids(ids: Node) -> None:
    if ids.ndim != 2 or not ids.dtype.is_int:
        raise ShapeError(f"input_ids must be (batch, seq) integers, got {ids.dtype.name} "
                         f"{format_shape(ids.shape)}")


def _check_heads(config: str, width_name: str, width, heads_name: str, heads,
                 fix: str = "") -> None:
    """Refuse heads that do not split the model's width: each head's size is then
    width // heads, and the projections would silently drop the remainder's features."""
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool)
               for v in (width, heads)) or heads < 1 or width % heads:
        raise ArgumentError(f"{config}: {width_name}={width!r} is not a multiple of "
                            f"{heads_name}={heads!r} (each head gets {width_name} / "
                            f"{heads_name} features); pick a number of heads that divides "
                            f"{width_name}{fix}")


# --------------------------------------------------------------------------------- GPT-2
@dataclass(frozen=True)
class GPT2Config:
    """GPT-2 sizes; defaults are GPT-2 small (124M)."""

    vocab_size: int = 50257
    n_positions: int = 1024  # learned position table: the longest sequence
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None  # MLP width; None: 4 * n_embd
    layer_norm_epsilon: float = 1e-5
    activation: str = "gelu_new"  # tanh-approximated GELU
    tie_word_embeddings: bool = True
    scale_attn_weights: bool = True  # scores by 1/sqrt(head_dim); False: unscaled
    scale_attn_by_inverse_layer_idx: bool = False  # and by 1/(layer + 1) (Stanford CRFM's)

    def __post_init__(self):
        # GPT-2's heads split n_embd, with no head_dim of their own: a remainder would build a
        # fused qkv of 3 * n_head * (n_embd // n_head) columns, no GPT-2's (transformers
        # refuses the config), and bind no checkpoint
        _check_heads("GPT2Config", "n_embd", self.n_embd, "n_head", self.n_head)

    @classmethod
    def from_hf(cls, config) -> GPT2Config:
        """From a transformers ``GPT2Config`` (``reorder_and_upcast_attn`` only changes the
        rounding of the scores, so it is not read)."""
        return cls(vocab_size=config.vocab_size, n_positions=config.n_positions,
                   n_embd=config.n_embd, n_layer=config.n_layer, n_head=config.n_head,
                   n_inner=config.n_inner, layer_norm_epsilon=config.layer_norm_epsilon,
                   activation=check_activation(config.activation_function,
                                               "GPT2Config.from_hf",
                                               "activation_function"),
                   tie_word_embeddings=getattr(config, "tie_word_embeddings", True),
                   scale_attn_weights=bool(getattr(config, "scale_attn_weights", True)),
                   scale_attn_by_inverse_layer_idx=bool(
                       getattr(config, "scale_attn_by_inverse_layer_idx", False)))

    def attention_scale(self, layer: int) -> float | None:
        """The scale of layer ``layer``'s scores as transformers computes it; None where it is
        attention's own default (1/sqrt(head_dim)), which keeps the usual graph."""
        if self.scale_attn_weights and not self.scale_attn_by_inverse_layer_idx:
            return None
        scale = (self.n_embd // self.n_head) ** -0.5 if self.scale_attn_weights else 1.0
        return scale / float(layer + 1) if self.scale_attn_by_inverse_layer_idx else scale


class GPT2:
    """GPT-2: token + learned position embeddings, pre-norm blocks with LayerNorm, fused-qkv
    Conv1D attention and a GELU MLP, a final LayerNorm and the (tied) LM head."""

    def __init__(self, config: GPT2Config, *, prefix: str = "transformer"):
        c = self.config = config
        eps = c.layer_norm_epsilon
        self.wte = Embedding(c.vocab_size, c.n_embd, name=_join(prefix, "wte"))
        self.wpe = Embedding(c.n_positions, c.n_embd, name=_join(prefix, "wpe"))
        self.blocks = []
        for i in range(c.n_layer):
            h = _join(prefix, f"h.{i}")
            attn = MultiHeadAttention(c.n_embd, c.n_head, name=f"{h}.attn", bias=True,
                                      fused_qkv=True, transposed=True,
                                      scale=c.attention_scale(i))
            mlp = MLP(c.n_embd, c.n_inner or 4 * c.n_embd, name=f"{h}.mlp",
                      activation=c.activation, transposed=True)
            self.blocks.append(TransformerBlock(attn, mlp, LayerNorm(c.n_embd, name=f"{h}.ln_1",
                                                                     eps=eps),
                                                LayerNorm(c.n_embd, name=f"{h}.ln_2", eps=eps)))
        self.ln_f = LayerNorm(c.n_embd, name=_join(prefix, "ln_f"), eps=eps)
        self.lm_head = None if c.tie_word_embeddings else \
            Linear(c.n_embd, c.vocab_size, name="lm_head", bias=False)

    def __call__(self, ids: Node | None = None, *, cache: KVCache | None = None,
                 last_only: bool = False, pad: Node | None = None) -> Node:
        """Logits (batch, seq, vocab) for ``ids`` (default: :func:`input_ids`); with
        ``last_only`` (batch, 1, vocab), the head applied to the last position only.
        ``pad`` (batch,) int64: each row's count of left-padding tokens (see
        :func:`positions`); None: no padding."""
        ids = input_ids() if ids is None else ids
        _check_ids(ids)
        if cache is not None and cache.max_len > self.config.n_positions:
            raise ArgumentError(f"GPT2: a cache of {cache.max_len} tokens outruns the "
                                f"{self.config.n_positions} learned positions")
        past = cache.past if cache is not None else 0
        x = self.wte(ids) + self.wpe(positions(ids.shape[1], past, pad))
        for block in self.blocks:
            x = block(x, cache=cache, pad=pad)
        x = self.ln_f(_last(x) if last_only else x)
        return self.wte.attend(x) if self.lm_head is None else self.lm_head(x)


# --------------------------------------------------------------------------------- Llama
@dataclass(frozen=True)
class LlamaConfig:
    """Llama-family sizes (also Mistral, Qwen2, Qwen3)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None = None  # None: as many as query heads (no GQA)
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    hidden_act: str = "silu"
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v projections
    attention_out_bias: bool = False  # bias on o_proj (Llama's attention_bias sets both)
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm per head on q and k before RoPE
    sliding_window: int | None = None  # a query sees itself and window - 1 earlier tokens
    # per layer "full_attention" or "sliding_attention"; None: every layer slides (Mistral)
    layer_types: tuple[str, ...] | None = None
    rope_scaling: RopeScaling | None = None  # Llama 3's, linear or yarn; None: unscaled RoPE

    def __post_init__(self):
        if self.head_dim is None:  # an explicit head_dim (Qwen3, Gemma) need not divide it
            _check_heads("LlamaConfig", "hidden_size", self.hidden_size, "num_attention_heads",
                         self.num_attention_heads, " (or give head_dim)")
        window, types, n = self.sliding_window, self.layer_types, self.num_hidden_layers
        if window is not None and (not isinstance(window, int) or window < 1):
            raise ArgumentError(f"LlamaConfig: sliding_window={window!r} must be a positive int "
                                "(or None)")
        if types is not None:
            odd = sorted(set(types) - {"full_attention", "sliding_attention"})
            if len(types) != n or odd:
                raise ArgumentError(f"LlamaConfig: layer_types must name one of "
                                    f"'full_attention', 'sliding_attention' for each of the {n} "
                                    f"layers; got {list(types)} (other attention kinds are not "
                                    "built)")

    def window(self, layer: int) -> int | None:
        """Layer ``layer``'s sliding window, None where it attends to every earlier token."""
        if self.layer_types is not None and self.layer_types[layer] != "sliding_attention":
            return None
        return self.sliding_window

    @classmethod
    def from_hf(cls, config) -> LlamaConfig:
        """From a transformers Llama, Mistral, Qwen2 or Qwen3 config; raises for features these
        layers do not build (RoPE types other than the default, linear, llama3 and yarn, RoPE
        per layer type, attention kinds other than full and sliding)."""
        theta, scaling = _rope_from_hf(config)
        model_type = getattr(config, "model_type", "llama")
        window, layer_types = _sliding_layers(config, model_type)
        qkv_bias, out_bias, mlp_bias = _biases(config, model_type)
        return cls(vocab_size=config.vocab_size, hidden_size=config.hidden_size,
                   intermediate_size=config.intermediate_size,
                   num_hidden_layers=config.num_hidden_layers,
                   num_attention_heads=config.num_attention_heads,
                   num_key_value_heads=getattr(config, "num_key_value_heads", None),
                   head_dim=getattr(config, "head_dim", None), rms_norm_eps=config.rms_norm_eps,
                   rope_theta=float(theta),
                   hidden_act=check_activation(config.hidden_act, "LlamaConfig.from_hf",
                                               "hidden_act"),
                   tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
                   attention_bias=qkv_bias, attention_out_bias=out_bias, mlp_bias=mlp_bias,
                   qk_norm=model_type.startswith("qwen3"), sliding_window=window,
                   layer_types=layer_types, rope_scaling=scaling)


# The bias flags each model type's transformers code reads (a type not listed: Llama's); a
# flag its code does not read is ignored there, whatever the config says
_BIAS_FLAGS = {"llama": ("attention_bias", "mlp_bias"), "mistral": (), "qwen2": (),
               "qwen3": ("attention_bias",)}


def _biases(config, model_type: str) -> tuple[bool, bool, bool]:
    """(q/k/v, o_proj, MLP) biases as the model type's transformers code builds them: Llama's
    ``attention_bias`` on all four projections and its ``mlp_bias``, Qwen3's
    ``attention_bias`` alone, Qwen2's q/k/v biases always (no flag), Mistral none. Why by
    type: a flag read where transformers ignores it (a Mistral or Qwen2 config carrying
    ``attention_bias`` or ``mlp_bias`` true) built biases its checkpoint does not hold, and the
    model was refused for weights it never had."""
    flags = _BIAS_FLAGS.get(model_type, _BIAS_FLAGS["llama"])
    attention, mlp = (name in flags and bool(getattr(config, name, False))
                      for name in ("attention_bias", "mlp_bias"))
    return attention or model_type == "qwen2", attention, mlp


_ROPE_BUILT = "default (unscaled), " + ", ".join(RopeScaling.TYPES)


def _rope_from_hf(config) -> tuple[float, RopeScaling | None]:
    """(theta, scaling) of a transformers config's RoPE: ``rope_parameters`` (transformers 5)
    or ``rope_scaling`` beside ``rope_theta`` (4.x, and config.json files). Types not built are
    refused, each with what is built and what to do instead; ``dynamic`` and ``longrope``
    because their frequencies depend on the sequence length at run time: one compiled program
    serves every length, so it cannot switch frequencies partway through a generation as
    transformers does."""
    where = "LlamaConfig.from_hf"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) \
        or {}
    if any(isinstance(v, dict) for v in rope.values()):
        raise ArgumentError(f"{where}: RoPE parameters per layer type ({sorted(rope)}) are not "
                            "supported (one RoPE for every layer); tg.from_torch(model, ...) "
                            "may import this model for single forward passes")
    kind = rope.get("rope_type", rope.get("type", "default"))
    theta = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
    if kind == "default":
        return theta, None
    if kind in RopeScaling.TYPES:
        return theta, RopeScaling.from_hf(rope, config, where)
    refused = f"{where}: RoPE type {kind!r} is not supported (supported: {_ROPE_BUILT})"
    if kind == "dynamic":
        n = getattr(config, "max_position_embeddings", None)
        raise ArgumentError(
            f"{refused}: dynamic NTK scaling recomputes the frequencies once a sequence "
            f"outgrows max_position_embeddings ({n}), which one compiled program cannot "
            "follow, and tg.from_torch cannot import it either (torch.export stops at that "
            f"length test). Up to {n} tokens it is the default RoPE exactly: for a max_len of "
            f"at most {n}, set config.rope_parameters = {{'rope_type': 'default', "
            f"'rope_theta': {theta}}} before building the generator")
    if kind == "longrope":
        raise ArgumentError(
            f"{refused}: LongRoPE switches between its short and long frequency factors by the "
            "sequence length at run time, and tg.from_torch cannot import it either (it writes "
            "its frequency buffer in place); run this model in transformers")
    raise ArgumentError(f"{refused}; tg.from_torch(model, ...) may import this model for "
                        "single forward passes")


def _sliding_layers(config, model_type: str) -> tuple[int | None, tuple[str, ...] | None]:
    """(sliding_window, layer_types) as transformers' modeling code reads them: Mistral slides
    every layer by ``sliding_window`` (its ``layer_types`` are ignored there), Qwen2/3 the
    layers ``layer_types`` (or ``max_window_layers``) mark, and only under
    ``use_sliding_window``; Llama never. Read rather than ignored: a sequence longer than the
    window has other logits with it."""
    n = config.num_hidden_layers
    if model_type == "llama":
        return None, None
    window = getattr(config, "sliding_window", None)
    if model_type != "mistral" and not getattr(config, "use_sliding_window", False):
        window = None
    if window is None or model_type == "mistral":
        return window, None
    types = getattr(config, "layer_types", None)
    if types is None:  # transformers before layer_types: the layers from max_window_layers on
        first = getattr(config, "max_window_layers", 0) or 0
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
    return window, tuple(types)


class Llama:
    """Llama: token embedding, pre-norm blocks with RMSNorm, GQA attention with RoPE (and
    Qwen3's q/k norms), a SwiGLU MLP, a final RMSNorm and the LM head."""

    def __init__(self, config: LlamaConfig, *, prefix: str = "model"):
        c = self.config = config
        eps = c.rms_norm_eps
        d = c.hidden_size
        self.embed_tokens = Embedding(c.vocab_size, d, name=_join(prefix, "embed_tokens"))
        self.blocks = []
        for i in range(c.num_hidden_layers):
            layer = _join(prefix, f"layers.{i}")
            attn = MultiHeadAttention(d, c.num_attention_heads, name=f"{layer}.self_attn",
                                      kv_heads=c.num_key_value_heads, head_dim=c.head_dim,
                                      bias=c.attention_bias, out_bias=c.attention_out_bias,
                                      rope_theta=c.rope_theta, rope_scaling=c.rope_scaling,
                                      qk_norm_eps=eps if c.qk_norm else None,
                                      window=c.window(i))
            mlp = MLP(d, c.intermediate_size, name=f"{layer}.mlp", activation=c.hidden_act,
                      gated=True, bias=c.mlp_bias)
            self.blocks.append(TransformerBlock(
                attn, mlp, RMSNorm(d, name=f"{layer}.input_layernorm", eps=eps),
                RMSNorm(d, name=f"{layer}.post_attention_layernorm", eps=eps)))
        self.norm = RMSNorm(d, name=_join(prefix, "norm"), eps=eps)
        self.lm_head = None if c.tie_word_embeddings else \
            Linear(d, c.vocab_size, name="lm_head", bias=False)

    def __call__(self, ids: Node | None = None, *, cache: KVCache | None = None,
                 last_only: bool = False, pad: Node | None = None) -> Node:
        """Logits (batch, seq, vocab) for ``ids`` (default: :func:`input_ids`); with
        ``last_only`` (batch, 1, vocab), the head applied to the last position only.
        ``pad`` (batch,) int64: each row's count of left-padding tokens (see
        :func:`positions`); None: no padding."""
        ids = input_ids() if ids is None else ids
        _check_ids(ids)
        x = self.embed_tokens(ids)
        for block in self.blocks:
            x = block(x, cache=cache, pad=pad)
        x = self.norm(_last(x) if last_only else x)
        return self.embed_tokens.attend(x) if self.lm_head is None else self.lm_head(x)
