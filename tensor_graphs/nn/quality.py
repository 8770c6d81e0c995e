"""``tg.quality(a, b, inputs)``: how far a program's outputs are from a reference program's.

Made for a quantized model against its float one (issue 23): the quantized scheme's error is
the user's choice of model, not a kernel's tolerance, so the planner cannot judge it; this
reports it. For any two programs with the same inputs and outputs, the norm-wise error
``||a - b|| / ||b||`` of each output (``numerics.relative_error``, the one error measure; ``b``
is the reference). For a language model (two ``tg.nn.Generator`` s, or two causal-LM programs
from token ids to logits) also:

- the **greedy tokens**: both decode ``tokens`` tokens greedily from the same prompt and the
  positions where they agree are counted; after the first difference the two continue from
  different prefixes, so ``first_difference`` is reported beside the count;
- on a **text** (token ids, or a string with its tokenizer; without one, its UTF-8 bytes as
  ids, for random-weight models with no tokenizer at hand), teacher-forced: the
  **next-token agreement** (at each prefix of the text, whether both pick the same greedy
  token: the agreement free of the divergence above) and the **perplexity** of each,
  ``exp(mean -log p(next token))`` over the text's positions, and their difference.

It sits with the models (it runs programs and generators, above the runtime), and prints its
report unless ``show=False``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from tensor_graphs.errors import ArgumentError, ShapeError
from tensor_graphs.numerics import relative_error
from tensor_graphs.runtime.values import on_host

TOKEN_INPUT = "input_ids"  # the feed a causal-LM program takes its token ids in


@dataclass
class Quality:
    """What ``quality`` measured (``None``: not measured for these programs)."""

    errors: list[float]  # per output: ||a - b|| / ||b||
    shapes: list[tuple[int, ...]] = field(default_factory=list)  # each output's shape
    tokens: int | None = None  # greedy tokens compared
    agree: int | None = None  # of them, equal at the same position
    first_difference: int | None = None  # the first position where they differ
    text_tokens: int | None = None  # next-token predictions on the text
    next_agree: int | None = None  # of them, the same greedy token
    perplexity_a: float | None = None
    perplexity_b: float | None = None

    @property
    def agreement(self) -> float | None:
        """Share of the greedy tokens that agree."""
        return None if not self.tokens else self.agree / self.tokens

    @property
    def perplexity_difference(self) -> float | None:
        """Perplexity of ``a`` minus that of ``b`` on the text."""
        if self.perplexity_a is None or self.perplexity_b is None:
            return None
        return self.perplexity_a - self.perplexity_b

    def __str__(self) -> str:
        lines = [f"output {i} {shape}: relative error ||a - b|| / ||b|| = {err:.3g}"
                 for i, (err, shape) in enumerate(zip(self.errors, self.shapes))]
        if self.tokens is not None:
            first = "" if self.first_difference is None else \
                (f" (first difference at token {self.first_difference}; later tokens follow "
                 "different prefixes)")
            lines.append(f"greedy tokens: {self.agree} of {self.tokens} agree{first}")
        if self.text_tokens is not None:
            diff = self.perplexity_difference
            rel = diff / self.perplexity_b if self.perplexity_b else math.nan
            lines.append(f"next-token agreement on the text: {self.next_agree} of "
                         f"{self.text_tokens}")
            lines.append(f"perplexity on the text ({self.text_tokens} predictions): a "
                         f"{self.perplexity_a:.6g}, b {self.perplexity_b:.6g}, difference "
                         f"{diff:+.4g} ({rel:+.3%})")
        return "\n".join(lines)


def pooled(reports: Sequence[Quality]) -> Quality:
    """One report of several (prompts, texts) of the same two models: counts summed, the
    perplexities over all the texts' predictions together (``exp`` of the pooled mean
    ``-log p``, each text weighted by its predictions), each output's error the largest.
    One prompt's 64 greedy tokens say little (a near-tie ends the agreement); several say
    how often that happens."""
    if not reports:
        raise ArgumentError("quality: pooled needs at least one report")
    errors = [max(r.errors[i] for r in reports) for i in range(len(reports[0].errors))]
    out = Quality(errors, list(reports[0].shapes))
    greedy = [r for r in reports if r.tokens is not None]
    if greedy:
        out.tokens = sum(r.tokens for r in greedy)
        out.agree = sum(r.agree for r in greedy)
        firsts = [r.first_difference for r in greedy if r.first_difference is not None]
        out.first_difference = min(firsts) if firsts else None
    scored = [r for r in reports if r.text_tokens is not None]
    if scored:
        n = sum(r.text_tokens for r in scored)
        out.text_tokens = n
        out.next_agree = sum(r.next_agree for r in scored)
        out.perplexity_a = math.exp(sum(r.text_tokens * math.log(r.perplexity_a)
                                        for r in scored) / n)
        out.perplexity_b = math.exp(sum(r.text_tokens * math.log(r.perplexity_b)
                                        for r in scored) / n)
    return out


def quality(a, b, inputs=None, *, tokens: int = 32, text=None, tokenizer=None,
            show: bool = True) -> Quality:
    """Compare program ``a`` with the reference ``b`` (see the module doc) and return (and,
    with ``show``, print) the ``Quality`` report.

    ``a``, ``b``: two compiled programs (``tg.compile``, ``tg.from_torch``...) fed the same
    ``inputs`` (a mapping of feeds), or two ``tg.nn.Generator`` s given a prompt's token ids
    (``inputs``: (seq,) or (batch, seq)). ``tokens``: greedy tokens to compare (0: none).
    ``text``: token ids, or a string (encoded by ``tokenizer``, a callable or an object with
    ``encode``, else as its UTF-8 bytes); for programs it makes them causal LMs fed
    ``input_ids`` (their first output the logits (batch, seq, vocab)), whose greedy tokens
    are decoded without a cache, a call per token on the whole prefix: compile them with
    ``bounds=`` so one plan serves every length."""
    from tensor_graphs.nn.generate import Generator

    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ArgumentError(f"quality: tokens must be a whole number >= 0, got {tokens!r}")
    if isinstance(a, Generator) != isinstance(b, Generator):
        raise ArgumentError("quality: compare two Generators or two programs, got "
                            f"{type(a).__name__} and {type(b).__name__}")
    if isinstance(a, Generator):
        report = _generators(a, b, inputs, tokens, text, tokenizer)
    else:
        report = _programs(a, b, inputs, tokens, text, tokenizer)
    if show:
        print(report)
    return report


def _outputs(values) -> list[np.ndarray]:
    return [np.asarray(v) for v in (values if isinstance(values, (list, tuple)) else [values])]


def _errors(got: Sequence[np.ndarray], ref: Sequence[np.ndarray]) -> tuple[list, list]:
    if len(got) != len(ref):
        raise ShapeError(f"quality: a has {len(got)} outputs, b {len(ref)}: compare programs of "
                         "the same graph")
    errors, shapes = [], []
    for i, (x, y) in enumerate(zip(got, ref)):
        if x.shape != y.shape:
            raise ShapeError(f"quality: output {i} is {x.shape} in a and {y.shape} in b: "
                             "compare programs of the same graph")
        errors.append(relative_error(x, y))
        shapes.append(tuple(x.shape))
    return errors, shapes


def _ids(text, tokenizer, vocab: int | None) -> np.ndarray:
    """The text's token ids, (n,), checked against the vocabulary (when known)."""
    if isinstance(text, str):
        if tokenizer is None:
            ids = list(text.encode("utf-8"))
        else:
            encode = getattr(tokenizer, "encode", tokenizer)
            ids = encode(text)
    else:
        ids = text
    ids = np.asarray(ids).reshape(-1)
    if ids.size < 2 or not np.issubdtype(ids.dtype, np.integer):
        raise ArgumentError(f"quality: the text needs at least 2 integer token ids, got "
                            f"{ids.size} of {ids.dtype}")
    if vocab is not None and (ids.min() < 0 or ids.max() >= vocab):
        raise ArgumentError(f"quality: the text's token ids must be in 0..{vocab - 1} (the "
                            f"vocabulary), got {int(ids.min())}..{int(ids.max())}; pass the "
                            "model's tokenizer (tokenizer=)")
    return ids.astype(np.int64)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def _text_scores(logits_a: np.ndarray, logits_b: np.ndarray, ids: np.ndarray,
                 report: Quality) -> None:
    """Next-token agreement and perplexities from each model's logits (n - 1, vocab) predicting
    ``ids[1:]``."""
    targets = ids[1:]
    rows = np.arange(targets.size)
    report.text_tokens = int(targets.size)
    report.next_agree = int((logits_a.argmax(-1) == logits_b.argmax(-1)).sum())
    report.perplexity_a = float(np.exp(-_log_softmax(logits_a)[rows, targets].mean()))
    report.perplexity_b = float(np.exp(-_log_softmax(logits_b)[rows, targets].mean()))


def _greedy(report: Quality, mine: list[int], theirs: list[int]) -> None:
    report.tokens = len(theirs)
    report.agree = sum(x == y for x, y in zip(mine, theirs))
    report.first_difference = next((i for i, (x, y) in enumerate(zip(mine, theirs)) if x != y),
                                   None)


# ------------------------------------------------------------------------------ generators
def _prompt(inputs) -> np.ndarray:
    if inputs is None:
        raise ArgumentError("quality: two Generators need a prompt's token ids as inputs")
    if hasattr(inputs, "detach"):
        inputs = inputs.detach().cpu().numpy()
    ids = np.asarray(inputs)
    return ids[None, :] if ids.ndim == 1 else ids


def _generators(a, b, inputs, tokens: int, text, tokenizer) -> Quality:
    if a.vocab_size != b.vocab_size:
        raise ShapeError(f"quality: the generators' vocabularies differ ({a.vocab_size} and "
                         f"{b.vocab_size})")
    prompt = _prompt(inputs)
    first_a, first_b = (_first_logits(g, prompt) for g in (a, b))
    errors, shapes = _errors([first_a], [first_b])
    report = Quality(errors, shapes)
    if tokens:
        real = np.ones(prompt.shape, np.int64)  # see _first_logits
        mine = [int(t[0]) for t in a.stream(prompt, tokens, attention_mask=real)]
        theirs = [int(t[0]) for t in b.stream(prompt, tokens, attention_mask=real)]
        _greedy(report, mine, theirs)
    if text is not None:
        ids = _ids(text, tokenizer, a.vocab_size)
        for g in (a, b):
            if ids.size - 1 > g.max_len:
                raise ShapeError(f"quality: a text of {ids.size} tokens needs a cache of "
                                 f"{ids.size - 1}; the generator holds {g.max_len} (build it "
                                 "with a larger max_len, or shorten the text)")
        _text_scores(_teacher_forced(a, ids), _teacher_forced(b, ids), ids, report)
    return report


def _first_logits(gen, prompt: np.ndarray) -> np.ndarray:
    """The prefill's logits for the prompt (the last position's). Every token is real (a
    mask of ones): two generators compared attend alike to a token equal to their pad id,
    which a generation compared with transformers' would refuse."""
    ids, _ = gen._check(prompt, 1, np.ones(np.shape(prompt), np.int64))  # noqa: SLF001
    gen.prefill.bind(**gen._empty)  # noqa: SLF001
    return on_host(gen.prefill(input_ids=ids, **_unpadded(gen))[0])  # (a GPU's stay there)


def _unpadded(gen) -> dict:
    """The feeds beside ``input_ids`` of an unpadded batch. A generator built
    ``padded=True`` (as ``tg.generate`` builds one for a padded batch) holds the padded
    programs only, whose input ``pad`` (each row's padding) is then zeros: called without
    it, they refused the comparison with a missing feed."""
    return {"pad": np.zeros(gen.batch, np.int64)} if gen._padded_only else {}  # noqa: SLF001


def _teacher_forced(gen, ids: np.ndarray) -> np.ndarray:
    """Logits (n - 1, vocab) predicting ``ids[1:]``: the first token prefilled, then each
    next one of the text decoded into the cache (batch row 0 of a batch-1 generator)."""
    if gen.batch != 1:
        raise ShapeError(f"quality: scoring a text needs a generator of batch 1, got "
                         f"{gen.batch}")
    feeds = _unpadded(gen)
    gen.prefill.bind(**gen._empty)  # noqa: SLF001
    rows = [on_host(gen.prefill(input_ids=ids[None, :1], **feeds)[0])[0, -1]]
    gen.decode.bind(**{n: gen.prefill.state(n) for n in gen.cache_names})
    for t in ids[1:-1]:
        rows.append(on_host(gen.decode(input_ids=np.array([[t]], np.int64), **feeds)[0])[0, -1])
    return np.stack(rows)


# -------------------------------------------------------------------------------- programs
def _programs(a, b, inputs, tokens: int, text, tokenizer) -> Quality:
    feeds = dict(inputs or {})
    if not isinstance(inputs, Mapping) and inputs is not None:
        raise ArgumentError("quality: programs take their inputs as a mapping of feeds "
                            f"(name -> array), got {type(inputs).__name__}")
    report = Quality([], [])
    if feeds:
        report.errors, report.shapes = _errors(_outputs(a(**feeds)), _outputs(b(**feeds)))
    if text is None:
        if not feeds:
            raise ArgumentError("quality: give the programs' inputs, or text= for causal-LM "
                                "programs")
        return report
    # the vocabulary is the logits' last axis: read from a call on zeros of the text's length
    # (a program planned per length plans it once), before any id of the text is fed
    n = _ids(text, tokenizer, None).size
    probe = _outputs(a(**{TOKEN_INPUT: np.zeros((1, n - 1), np.int64)}))[0]
    ids = _ids(text, tokenizer, int(probe.shape[-1]))
    logits = []
    for prog in (a, b):
        out = _outputs(prog(**{TOKEN_INPUT: ids[None, :-1]}))[0]
        if out.ndim != 3 or out.shape[:2] != (1, ids.size - 1):
            raise ShapeError(f"quality: a causal-LM program's first output must be logits "
                             f"(batch, seq, vocab); for input_ids (1, {ids.size - 1}) it gave "
                             f"{out.shape}")
        logits.append(out[0])
    _text_scores(logits[0], logits[1], ids, report)
    if tokens:
        prompt = np.asarray(feeds.get(TOKEN_INPUT, ids[None, :1])).astype(np.int64)
        prompt = prompt[None, :] if prompt.ndim == 1 else prompt
        _greedy(report, _decode(a, prompt, tokens), _decode(b, prompt, tokens))
    return report


def _decode(prog, prompt: np.ndarray, tokens: int) -> list[int]:
    """Greedy tokens of a causal-LM program without a cache: the whole prefix each step."""
    ids = prompt[:1]
    out = []
    for _ in range(tokens):
        logits = _outputs(prog(**{TOKEN_INPUT: ids}))[0]
        token = int(logits[0, -1].argmax())
        out.append(token)
        ids = np.concatenate([ids, np.array([[token]], np.int64)], axis=1)
    return out
