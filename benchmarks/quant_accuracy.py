"""int8-dynamic's activation schemes on MiniLM's real weights, in numpy (issue 23's accuracy).

Why numpy: the question is which rounding of the activations keeps real sentences' cosine
similarities within 0.01 of float32, before any kernel is written for it; a plain float64
BERT forward with each linear's input and weight rounded as a scheme would round them
answers it in seconds. Weights are int8 per output channel in every int8 scheme (what
``tg.quantize`` writes); only the activation rounding and the layers kept in float differ.

    python benchmarks/quant_accuracy.py [--sentences 16]

Sentences: ``jobs.minilm.pydoc_sentences`` (the first plain sentence, 40-160 characters, of
each of the standard library's ``pydoc_data.topics`` entries in sorted order; the test reads
the same), the first ``--sentences`` of them, plus the five of docs/benchmarks.md's
``tg run minilm`` example. Prints per scheme the largest |cosine(scheme) - cosine(float32)|
over all pairs and the embeddings' error. The reference is the same forward in float64
(float32's own rounding is ~1e-7 of it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tensor_graphs.jobs import minilm  # noqa: E402

EXAMPLE = ["A man is eating food.", "A man is eating a piece of bread.", "The sky is blue.",
           "A man is riding a horse.", "Someone is eating bread."]


def load_weights() -> tuple[dict, dict]:
    from safetensors.numpy import load_file

    d = minilm.model_dir()
    w = {k: v.astype(np.float64) for k, v in load_file(str(d / "model.safetensors")).items()}
    return w, json.loads((d / "config.json").read_text())


# ---------------------------------------------------------------- activation roundings
def sym_rows(x: np.ndarray, group: int | None = None) -> np.ndarray:
    """Symmetric int8 with one scale per row, or per ``group`` consecutive channels of a row."""
    shape = x.shape
    g = shape[-1] if group is None else group
    v = x.reshape(-1, shape[-1] // g, g)
    s = np.abs(v).max(-1, keepdims=True) / 127.0
    s = np.where(s > 0, s, 1.0)
    return (np.clip(np.round(v / s), -127, 127) * s).reshape(shape)


def asym_rows(x: np.ndarray, group: int | None = None) -> np.ndarray:
    """uint8 with a zero point, one (scale, zero point) per row (or group): ONNX Runtime's
    per-tensor rounding applied per row; the range always holds 0."""
    shape = x.shape
    g = shape[-1] if group is None else group
    v = x.reshape(-1, shape[-1] // g, g)
    lo = np.minimum(v.min(-1, keepdims=True), 0.0)
    hi = np.maximum(v.max(-1, keepdims=True), 0.0)
    s = (hi - lo) / 255.0
    s = np.where(s > 0, s, 1.0)
    zp = np.round(-lo / s)
    return ((np.clip(np.round(v / s) + zp, 0, 255) - zp) * s).reshape(shape)


def q8_weight(w: np.ndarray, group: int | None = None) -> np.ndarray:
    """torch's (N, K) weight, symmetric int8 per output channel (row here), or per (output
    channel, ``group`` consecutive values along K): int8-dynamic's grouped weights."""
    n, k = w.shape
    g = k if group is None else group
    v = w.reshape(n, k // g, g)
    s = np.abs(v).max(-1, keepdims=True) / 127.0
    s = np.where(s > 0, s, 1.0)
    return (np.clip(np.round(v / s), -127, 127) * s).reshape(n, k)


# layer kinds: the linears of one BERT layer, by the name of their weight
KINDS = {"query": "attention.self.query", "key": "attention.self.key",
         "value": "attention.self.value", "attn_out": "attention.output.dense",
         "ffn_up": "intermediate.dense", "ffn_down": "output.dense"}


def forward(w: dict, cfg: dict, ids: np.ndarray, mask: np.ndarray, act=None,
            float_kinds=(), weights_int8: bool = True, weight_group: int | None = None,
            stats: dict | None = None) -> np.ndarray:
    """Normalised mean-pooled embeddings; ``act`` rounds each quantized linear's input,
    ``float_kinds`` (``KINDS``' keys) stay float32-exact (weights and inputs);
    ``weight_group``: the weights' scales per that many values along K (None: per channel)."""
    from math import sqrt

    from scipy.special import erf
    heads = cfg["num_attention_heads"]
    eps = cfg["layer_norm_eps"]

    def ln(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * w[p + ".weight"] + w[p + ".bias"]

    def linear(x, p, kind):
        wt = w[p + ".weight"]
        if stats is not None:
            r = np.abs(x).max(-1) / np.sqrt((x * x).mean(-1))
            stats.setdefault(kind, []).append(float(np.median(r)))
        if act is not None and kind not in float_kinds:
            x = act(x)
            if weights_int8:
                wt = q8_weight(wt, weight_group)
        return x @ wt.T + w[p + ".bias"]

    b, t = ids.shape
    x = (w["embeddings.word_embeddings.weight"][ids]
         + w["embeddings.position_embeddings.weight"][np.arange(t)][None]
         + w["embeddings.token_type_embeddings.weight"][0][None, None])
    x = ln(x, "embeddings.LayerNorm")
    bias = (1.0 - mask[:, None, None, :]) * -1e9
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        hd = x.shape[-1] // heads
        q, k, v = (linear(x, p + KINDS[n], n).reshape(b, t, heads, hd).transpose(0, 2, 1, 3)
                   for n in ("query", "key", "value"))
        sc = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd) + bias
        sc = np.exp(sc - sc.max(-1, keepdims=True))
        sc /= sc.sum(-1, keepdims=True)
        ctx = (sc @ v).transpose(0, 2, 1, 3).reshape(b, t, -1)
        x = ln(linear(ctx, p + KINDS["attn_out"], "attn_out") + x,
               p + "attention.output.LayerNorm")
        h = linear(x, p + KINDS["ffn_up"], "ffn_up")
        h = 0.5 * h * (1.0 + erf(h / sqrt(2.0)))
        x = ln(linear(h, p + KINDS["ffn_down"], "ffn_down") + x, p + "output.LayerNorm")
    m = mask[..., None].astype(np.float64)
    pooled = (x * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    return pooled / np.linalg.norm(pooled, axis=-1, keepdims=True)


def drift(emb: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(largest |cosine difference| over all pairs, embeddings' norm-wise relative error)."""
    s, r = emb @ emb.T, ref @ ref.T
    iu = np.triu_indices(len(emb), 1)
    return (float(np.abs(s - r)[iu].max()),
            float(np.linalg.norm(emb - ref) / np.linalg.norm(ref)))


def schemes() -> dict:
    """name -> forward options; each row one candidate fix of issue 23's accuracy."""
    return {
        # the weights alone in int8 (activations float): the floor every int8 scheme shares
        "int8-weight": dict(act=lambda x: x),
        # int8-dynamic before groups: one symmetric scale per activation row
        "rows, symmetric (before groups)": dict(act=sym_rows),
        # (a) a symmetric scale per 32 / 64 / 128 channels of a row
        "groups of 32 (weights per channel)": dict(act=lambda x: sym_rows(x, 32)),
        "groups of 64": dict(act=lambda x: sym_rows(x, 64)),
        "groups of 128": dict(act=lambda x: sym_rows(x, 128)),
        # (b) uint8 rows with a zero point
        "rows, asymmetric": dict(act=asym_rows),
        "groups of 32, asymmetric": dict(act=lambda x: asym_rows(x, 32)),
        # (c) the layers with outlier inputs in float32 (weights too: tg.quantize's skip=)
        "rows, FFN down float": dict(act=sym_rows, float_kinds=("ffn_down",)),
        "rows, FFN down + attn out float": dict(act=sym_rows,
                                                float_kinds=("ffn_down", "attn_out")),
        # (d) groups of 32 for the weights too (a scale per (channel, 32 along K)): what
        # tg.quantize's int8-dynamic writes now
        "groups of 32, weights too (chosen)": dict(act=lambda x: sym_rows(x, 32),
                                                   weight_group=32),
        "groups of 64, weights too": dict(act=lambda x: sym_rows(x, 64), weight_group=64),
        "groups of 32 asymmetric, weights too": dict(act=lambda x: asym_rows(x, 32),
                                                     weight_group=32),
        "weights in groups of 32 alone": dict(act=lambda x: x, weight_group=32),
        "groups of 32, FFN down float": dict(act=lambda x: sym_rows(x, 32),
                                             float_kinds=("ffn_down",)),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sentences", type=int, default=16,
                    help="pydoc_data.topics sentences (default 16; the 5 examples added)")
    args = ap.parse_args()
    w, cfg = load_weights()
    sets = {f"{args.sentences} pydoc sentences": minilm.pydoc_sentences(args.sentences),
            "5 example sentences": EXAMPLE}
    stats: dict = {}
    encoded = {k: minilm.encode(v) for k, v in sets.items()}
    ref = {k: forward(w, cfg, ids, mask, stats=stats) for k, (ids, mask) in encoded.items()}
    print("max |x| / rms of each linear's input rows (median over layers' medians): "
          + ", ".join(f"{k} {np.median(v):.1f}" for k, v in stats.items()))
    names = list(sets)
    print(f"{'scheme':34s}" + "".join(f"  {n:>32s}" for n in names))
    for name, opts in schemes().items():
        cells = []
        for k in names:
            d, e = drift(forward(w, cfg, *encoded[k], **opts), ref[k])
            cells.append(f"{d:.4f} (emb {e:.1e})")
        print(f"{name:34s}" + "".join(f"  {c:>32s}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
