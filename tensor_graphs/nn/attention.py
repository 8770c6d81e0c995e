"""Multi-head attention: grouped-query heads, rotary positions, causal masking, a KV cache.

The cache is program state: each layer's keys and values live in a ``tg.state`` of shape
(batch, kv_heads, past, head_dim) whose active length is the symbolic dim ``past``. A call
writes its new keys at ``past`` (``tg.state_update``) and attends over the whole active prefix,
so one compiled program serves the prefill (past = 0, seq = prompt length) and every decode
step (seq = 1): nothing is re-planned per token. The program keeps a state when the graph
returns its new version, which is why :class:`KVCache` collects them (``cache.updates``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tensor_graphs.errors import ArgumentError, ShapeError
from tensor_graphs.ir import api as tg
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.shapes import as_dim, format_shape
from tensor_graphs.nn.layers import Linear, RMSNorm, _join

__all__ = ["positions", "RopeScaling", "RotaryEmbedding", "KVCache", "MultiHeadAttention"]


def positions(seq, past=0, pad: Node | None = None) -> Node:
    """Absolute positions ``past, ..., past + seq - 1`` (int64) of the tokens of this call.

    ``pad`` (batch,): each row's count of left-padding tokens (a left-padded batch, as a
    tokenizer with ``padding_side="left"`` gives it). Then each row's own positions (batch,
    seq): ``past + i - pad[b]``, so a row's first real token is at 0 as it would be unpadded,
    and 0 at a padding token (transformers gives those 1; they are never attended to)."""
    ids = tg.iota(seq)
    past = as_dim(past)
    ids = ids if past == 0 else ids + tg.size(past)
    if pad is None:
        return ids
    shifted = tg.reshape(ids, (1, seq)) - tg.reshape(pad, (pad.shape[0], 1))
    return tg.maximum(shifted, tg.constant(0, "int64"))


@dataclass(frozen=True)
class RopeScaling:
    """A scaled RoPE, as transformers' ``rope_parameters`` (``rope_scaling``) name it: the
    types whose frequencies are fixed when the model is built, so one compiled program serves
    every length (``dynamic`` and ``longrope`` pick theirs from the sequence length at run
    time, and are not built).

    - ``linear`` (position interpolation): every inverse frequency divided by ``factor``.
    - ``llama3`` (Llama 3.1 and later): wavelengths shorter than
      ``original_max_position_embeddings / high_freq_factor`` kept, longer than
      ``original_max_position_embeddings / low_freq_factor`` divided by ``factor``, and those
      between interpolated smoothly.
    - ``yarn``: a per-dimension ramp between the interpolated and the original frequencies
      (``beta_fast``, ``beta_slow``, ``truncate``), and cos/sin multiplied by
      ``attention_factor`` (resolved from ``factor``/``mscale`` by :meth:`from_hf` when the
      config leaves it out).

    The arithmetic is transformers' ``modeling_rope_utils`` step for step in float32 (the
    same operations in the same order), so the frequencies are torch's but for the ulp its
    power may differ by (see :class:`RotaryEmbedding`): a reimplementation of the formula in
    another order or precision would drift further, where long positions magnify it.
    """

    rope_type: str
    factor: float
    original_max_position_embeddings: int | None = None  # llama3, yarn
    low_freq_factor: float | None = None  # llama3
    high_freq_factor: float | None = None  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    truncate: bool = True  # yarn: whole dimensions at the ramp's ends
    attention_factor: float = 1.0  # multiplies cos and sin (yarn's; 1 for linear, llama3)

    TYPES = ("linear", "llama3", "yarn")  # the scaled types built (besides the default)
    _NEEDS = {"linear": ("factor",),
              "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                         "original_max_position_embeddings"),
              "yarn": ("factor", "original_max_position_embeddings")}

    def __post_init__(self):
        if self.rope_type not in self.TYPES:
            raise ArgumentError(f"RopeScaling: rope_type {self.rope_type!r} is not built; "
                                f"supported: {', '.join(self.TYPES)} (or no scaling: None)")
        for key in self._NEEDS[self.rope_type]:
            value = getattr(self, key)
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise ArgumentError(f"RopeScaling: {self.rope_type} RoPE needs {key} > 0, "
                                    f"got {value!r}")

    @classmethod
    def from_hf(cls, rope: dict, config, where: str = "RopeScaling.from_hf") -> RopeScaling:
        """From a transformers RoPE dict of a built type (``rope_type`` or the older
        ``type``), with transformers' defaults: ``original_max_position_embeddings`` from the
        config's own field, else the dict, else ``max_position_embeddings`` (as
        ``standardize_rope_params``); yarn's ``factor`` (if None) and ``attention_factor``
        (if absent) derived as ``_compute_yarn_parameters`` derives them."""
        rope_type = rope.get("rope_type", rope.get("type"))
        original = getattr(config, "original_max_position_embeddings", None) or \
            rope.get("original_max_position_embeddings") or \
            getattr(config, "max_position_embeddings", None)
        missing = [k for k in cls._NEEDS.get(rope_type, ())
                   if k != "original_max_position_embeddings" and k not in rope]
        if missing:
            raise ArgumentError(f"{where}: {rope_type} RoPE parameters lack {', '.join(missing)} "
                                f"(got {dict(rope)})")
        if rope_type == "linear":
            return cls(rope_type, rope["factor"])
        if rope_type == "llama3":
            return cls(rope_type, rope["factor"], original, low_freq_factor=rope["low_freq_factor"],
                       high_freq_factor=rope["high_freq_factor"])
        if rope_type != "yarn":
            return cls(rope_type, rope.get("factor"))  # refused by __post_init__
        factor = rope.get("factor")
        if factor is None and original:  # DeepSeek-V3's: the ratio of the two lengths
            factor = getattr(config, "max_position_embeddings", original) / original
        attention = rope.get("attention_factor")
        if attention is None and factor is not None:
            mscale, mscale_all = rope.get("mscale"), rope.get("mscale_all_dim")
            attention = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all) \
                if mscale and mscale_all else _yarn_mscale(factor)
        return cls(rope_type, factor, original, beta_fast=rope.get("beta_fast") or 32,
                   beta_slow=rope.get("beta_slow") or 1, truncate=rope.get("truncate", True),
                   attention_factor=1.0 if attention is None else float(attention))

    def inv_freq(self, pos_freqs: np.ndarray, theta: float) -> np.ndarray:
        """The scaled inverse frequencies from the default ones' ``theta ** (2i / d)``
        (float32, ``pos_freqs``)."""
        inv = np.float32(1.0) / pos_freqs
        factor = self.factor
        if self.rope_type == "linear":
            return inv / factor
        if self.rope_type == "llama3":
            old, low, high = (self.original_max_position_embeddings, self.low_freq_factor,
                              self.high_freq_factor)
            wavelen = 2 * math.pi / inv
            scaled = np.where(wavelen > old / low, inv / factor, inv)
            with np.errstate(divide="ignore", invalid="ignore"):  # low == high: no medium band
                smooth = (old / wavelen - low) / (high - low)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            medium = ~(wavelen < old / high) & ~(wavelen > old / low)
            return np.where(medium, smoothed, scaled).astype(np.float32)
        dim = 2 * len(pos_freqs)  # yarn
        interpolation = np.float32(1.0) / (factor * pos_freqs)
        low, high = (_yarn_correction_dim(beta, dim, theta,
                                          self.original_max_position_embeddings)
                     for beta in (self.beta_fast, self.beta_slow))
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # transformers' guard against a zero-width ramp
        ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
        extrapolation = 1 - ramp
        return (interpolation * (1 - extrapolation) + inv * extrapolation).astype(np.float32)


def _yarn_mscale(scale: float, mscale: float = 1) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_correction_dim(rotations: float, dim: int, base: float, length: int) -> float:
    """The dimension whose wavelength turns ``rotations`` times over ``length`` tokens."""
    return (dim * math.log(length / (rotations * 2 * math.pi))) / (2 * math.log(base))


class RotaryEmbedding:
    """Rotary position embedding tables in transformers' layout (``rotate_half`` pairs).

    ``inv_freq`` is computed as transformers does (float32 ``theta ** (2i / d)``, then the
    ``scaling``'s change, see :class:`RopeScaling`), so the frequencies match torch's but for an
    ulp in a few (torch's float32 power is not always correctly rounded); cos/sin are built in
    the graph from the positions, for any (symbolic) length, and multiplied by the scaling's
    ``attention_factor`` where it is not 1 (as transformers scales its tables).
    """

    def __init__(self, head_dim: int, theta: float = 10000.0,
                 scaling: RopeScaling | None = None):
        if head_dim % 2:
            raise ShapeError(f"RotaryEmbedding: head_dim must be even, got {head_dim}")
        self.head_dim, self.theta, self.scaling = head_dim, float(theta), scaling
        exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim
        # the power in float64, rounded once: torch's float32 ``theta ** exponent`` (within an
        # ulp of it) agrees with that on ~99% of frequencies, numpy's float32 power on ~80%
        pos_freqs = np.power(self.theta, exponent.astype(np.float64)).astype(np.float32)
        self.inv_freq = (1.0 / pos_freqs).astype(np.float32) if scaling is None \
            else scaling.inv_freq(pos_freqs, self.theta)
        self.attention_factor = 1.0 if scaling is None else scaling.attention_factor

    def cos_sin(self, pos: Node) -> tuple[Node, Node]:
        """(seq, head_dim) cos and sin tables for int positions of shape (seq,); (batch, 1,
        seq, head_dim) for a row's own positions (batch, seq), broadcast over the heads."""
        shape = (pos.shape[0], 1) if pos.ndim == 1 else (pos.shape[0], 1, pos.shape[1], 1)
        angles = tg.reshape(tg.cast(pos, "float32"), shape) * self.inv_freq
        emb = tg.concat([angles, angles], axis=-1)
        cos, sin = tg.cos(emb), tg.sin(emb)
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos, sin

    def __call__(self, x: Node, pos: Node) -> Node:
        """Rotate x (..., seq, head_dim) by the angles of ``pos`` (seq,), or (batch, seq) for
        x (batch, heads, seq, head_dim)."""
        cos, sin = self.cos_sin(pos)
        return tg.rotary_embedding(x, cos, sin)


class KVCache:
    """Each attention layer's keys and values as ``tg.state`` of length ``past``, at most
    ``max_len`` tokens.

    Build the graph with ``cache=`` on the model (or attention layers), then compile the logits
    together with ``cache.updates`` (the new state versions: returning them makes the program
    keep the buffers) under ``cache.bounds(batch, seq)``, and bind ``cache.empty(batch)``
    before the first call. The program allocates each buffer once at its bound length
    (``bounds["past"] + bounds["seq"]``) and appends in place.
    """

    def __init__(self, max_len: int, *, past: str = "past"):
        if not isinstance(max_len, int) or max_len < 1:
            raise ArgumentError(f"KVCache: max_len must be a positive int, got {max_len!r}")
        self.max_len, self.past = max_len, as_dim(past)
        self._updates: dict[str, Node] = {}  # state name -> its new version

    def append(self, name: str, k: Node, v: Node) -> tuple[Node, Node]:
        """Write k, v (batch, kv_heads, seq, head_dim) after the cached tokens of layer
        ``name``; returns all keys and values (batch, kv_heads, past + seq, head_dim)."""
        out = []
        for kind, new in (("k", k), ("v", v)):
            b, h, _, d = new.shape
            cached = tg.state(f"{name}.{kind}_cache", (b, h, self.past, d), new.dtype)
            version = tg.state_update(cached, new, offset=self.past, axis=2)
            self._updates[cached.name] = version
            out.append(version)
        return out[0], out[1]

    @property
    def updates(self) -> list[Node]:
        """The new version of every cache state, to compile as outputs after the logits."""
        return list(self._updates.values())

    def names(self) -> list[str]:
        return list(self._updates)

    def bounds(self, batch: int, seq: int) -> dict[str, int]:
        """Bounds for ``tg.compile``: prompts of up to ``seq`` tokens and decoding until the
        cache holds ``max_len`` tokens (the last step runs at past = max_len - 1)."""
        if seq > self.max_len:
            raise ArgumentError(f"KVCache.bounds: seq={seq} exceeds max_len={self.max_len}")
        return {"batch": batch, "seq": seq, str(self.past): self.max_len - 1}

    def empty(self, batch: int) -> dict[str, np.ndarray]:
        """Zero-length caches for ``prog.bind(**cache.empty(batch))`` (a new generation)."""
        arrays = {}
        for name, version in self._updates.items():
            _, h, _, d = version.shape
            arrays[name] = np.zeros((batch, int(h), 0, int(d)), version.dtype.np_dtype)
        return arrays


class MultiHeadAttention:
    """Self-attention over (batch, seq, dim): projections, heads, RoPE, causal SDPA, output.

    - ``kv_heads < heads``: grouped-query attention (k/v heads shared by groups of q heads).
    - ``fused_qkv``: one projection producing [q | k | v] (GPT-2), sublayers ``c_attn`` and
      ``c_proj``; otherwise ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` (Llama). ``names``
      overrides them (same order). ``transposed``: Conv1D weights (see :class:`Linear`).
    - ``rope_theta``: rotary positions on q and k (None: none, e.g. GPT-2's learned positions);
      ``rope_scaling``: their :class:`RopeScaling` (Llama 3's, linear, yarn), None: unscaled.
    - ``qk_norm_eps``: RMSNorm of each head's q and k before RoPE (Qwen3's q_norm, k_norm).
    - ``bias`` for the q/k/v projections; ``out_bias`` (default: ``bias``) for the output.
    - ``scale``: of the scores (None: 1/sqrt(head_dim)); GPT-2 may leave them unscaled or
      divide by the layer number.
    - ``window``: sliding-window attention (Mistral, Qwen2/3's sliding layers): a query sees
      itself and the ``window - 1`` tokens before it, as transformers' sliding mask.
    """

    def __init__(self, dim: int, heads: int, *, name: str, kv_heads: int | None = None,
                 head_dim: int | None = None, bias: bool = False, out_bias: bool | None = None,
                 fused_qkv: bool = False, transposed: bool = False,
                 rope_theta: float | None = None, rope_scaling: RopeScaling | None = None,
                 qk_norm_eps: float | None = None, causal: bool = True,
                 names: tuple[str, ...] | None = None,
                 scale: float | None = None, window: int | None = None,
                 dtype: str = "float32"):
        kv_heads = heads if kv_heads is None else kv_heads
        if window is not None and (not isinstance(window, int) or window < 1 or not causal):
            raise ArgumentError(f"MultiHeadAttention: window={window!r} must be a positive int "
                                "on causal attention (or None: no sliding window)")
        if heads % kv_heads:
            raise ShapeError(f"MultiHeadAttention: heads ({heads}) must be a multiple of "
                             f"kv_heads ({kv_heads})")
        head_dim = dim // heads if head_dim is None else head_dim
        self.dim, self.heads, self.kv_heads, self.head_dim = dim, heads, kv_heads, head_dim
        self.name, self.causal, self.fused_qkv = name, causal, fused_qkv
        self.scale, self.window = scale, window
        out_bias = bias if out_bias is None else out_bias
        q_out, kv_out = heads * head_dim, kv_heads * head_dim
        names = names or (("c_attn", "c_proj") if fused_qkv
                          else ("q_proj", "k_proj", "v_proj", "o_proj"))
        if len(names) != (2 if fused_qkv else 4):
            raise ArgumentError(f"MultiHeadAttention: names must be (qkv, out) when fused, else "
                                f"(q, k, v, out); got {names!r}")

        def proj(sub, n_in, n_out, b):
            return Linear(n_in, n_out, name=_join(name, sub), bias=b, transposed=transposed,
                          dtype=dtype)

        if fused_qkv:
            self.qkv = proj(names[0], dim, q_out + 2 * kv_out, bias)
        else:
            self.q, self.k, self.v = (proj(names[i], dim, n, bias)
                                      for i, n in enumerate((q_out, kv_out, kv_out)))
        self.out = proj(names[-1], q_out, dim, out_bias)
        self.rope = RotaryEmbedding(head_dim, rope_theta, rope_scaling) \
            if rope_theta is not None else None
        self.q_norm = self.k_norm = None
        if qk_norm_eps is not None:
            self.q_norm = RMSNorm(head_dim, name=_join(name, "q_norm"), eps=qk_norm_eps,
                                  dtype=dtype)
            self.k_norm = RMSNorm(head_dim, name=_join(name, "k_norm"), eps=qk_norm_eps,
                                  dtype=dtype)

    def _project(self, x: Node) -> tuple[Node, Node, Node]:
        if not self.fused_qkv:
            return self.q(x), self.k(x), self.v(x)
        qkv = self.qkv(x)
        q_out, kv_out = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return (tg.slice_axis(qkv, -1, 0, q_out),
                tg.slice_axis(qkv, -1, q_out, q_out + kv_out),
                tg.slice_axis(qkv, -1, q_out + kv_out, q_out + 2 * kv_out))

    def __call__(self, x: Node, *, cache: KVCache | None = None, pad: Node | None = None
                 ) -> Node:
        """x (batch, seq, dim) -> (batch, seq, dim). With ``cache``, the tokens of x follow the
        ``cache.past`` cached ones: they are appended to the cache and attend to all of them.
        ``pad`` (batch,): each row's count of left-padding tokens, which no real token
        attends to (see :func:`positions`)."""
        if x.ndim != 3:
            raise ShapeError(f"{self.name}: attention takes (batch, seq, dim), got "
                             f"{format_shape(x.shape)}")
        batch, seq, _ = x.shape
        q, k, v = self._project(x)

        def heads(t, n, norm):  # (b, s, n*d) -> (b, n, s, d)
            t = tg.reshape(t, (batch, seq, n, self.head_dim))
            if norm is not None:
                t = norm(t)
            return tg.permute(t, (0, 2, 1, 3))

        q = heads(q, self.heads, self.q_norm)
        k = heads(k, self.kv_heads, self.k_norm)
        v = heads(v, self.kv_heads, None)
        past = cache.past if cache is not None else 0
        if self.rope is not None:
            pos = positions(seq, past, pad)
            q, k = self.rope(q, pos), self.rope(k, pos)
        if cache is None and self.window is None and pad is None:
            o = tg.scaled_dot_product_attention(q, k, v, is_causal=self.causal, scale=self.scale)
        else:
            # a window no shorter than the cache hides nothing (Mistral's 4096 under a shorter
            # cache): the decode program keeps the plain causal mask
            window = self.window if cache is None or (self.window or 0) < cache.max_len \
                else None
            if cache is not None:
                k, v = cache.append(self.name, k, v)
            mask = _offset_causal_mask(seq, past, window, pad) if self.causal else None
            o = tg.scaled_dot_product_attention(q, k, v, mask, scale=self.scale)
        o = tg.reshape(tg.permute(o, (0, 2, 1, 3)), (batch, seq, self.heads * self.head_dim))
        return self.out(o)

    def __repr__(self) -> str:
        return (f"MultiHeadAttention({self.dim}, heads={self.heads}, kv_heads={self.kv_heads}, "
                f"head_dim={self.head_dim}, name={self.name!r}, "
                f"rope={self.rope is not None}, qk_norm={self.q_norm is not None}"
                + (f", window={self.window}" if self.window is not None else "") + ")")


def _offset_causal_mask(seq, past, window: int | None = None, pad: Node | None = None
                        ) -> Node:
    """Additive (seq, past + seq) mask: query i (at position past + i) sees keys j <= past + i,
    and with a ``window`` only those with j > past + i - window.

    With ``pad`` (batch,), a left-padded batch's (batch, 1, seq, past + seq) mask: keys j <
    pad[b] (row b's padding) are hidden too, but from the padding query at j itself, which
    then sees only its own key rather than none (a row of -inf only would make NaN that its
    values carry into later layers; transformers unmasks such rows too). Windows count cache
    slots, as they do unpadded.

    Additive float (0 / -inf) rather than bool because that is the form the fused C attention
    kernels take; every row keeps at least its own key, so no row is fully masked.
    """
    total = as_dim(past) + as_dim(seq)
    row = tg.reshape(positions(seq, past), (seq, 1))
    col = tg.reshape(tg.iota(total), (1, total))
    hidden = tg.less(row, col)
    if window is not None:
        hidden = tg.logical_or(hidden, tg.less_equal(col + window, row))
    if pad is not None:
        padding = tg.less(col, tg.reshape(pad, (pad.shape[0], 1, 1, 1)))
        hidden = tg.logical_or(hidden, tg.logical_and(padding, tg.not_equal(col, row)))
    return tg.where(hidden, tg.constant(-math.inf, "float32"),
                    tg.constant(0.0, "float32"))
