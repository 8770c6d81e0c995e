"""The next token drawn at random, as transformers' ``generate(do_sample=True)`` draws it.

A step's scores (the last position's logits, after the repetition penalty) pass through
transformers' warpers in its order (temperature, top-k, top-p, min-p), and the token is
drawn from the softmax of what is left. This runs on the host, over a (batch, vocab) array a
step: the programs stay those of greedy decoding.

The draw is numpy's (a ``seed`` makes it repeatable), not torch's: the tokens follow
transformers' distribution, not its stream of random numbers, so a seed here and
``torch.manual_seed`` there give different tokens.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from tensor_graphs.errors import ArgumentError

# the warpers applied here, by transformers' names (GenerationConfig's fields)
SETTINGS = ("temperature", "top_k", "top_p", "min_p")


def _number(name: str, value, low: float, high: float, *, open_low: bool = False) -> float:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and \
        (low < value if open_low else low <= value) and value <= high
    if not ok:
        span = f"{'(' if open_low else '['}{low}, {high}]"
        raise ArgumentError(f"generate: {name} must be a number in {span}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Sampling:
    """The warpers' settings: ``temperature`` divides the scores; ``top_k`` keeps the k best
    (0: all); ``top_p`` the fewest best whose probabilities sum past it (1: all); ``min_p``
    those at least ``min_p`` times as likely as the best (None: all)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float | None = None

    @classmethod
    def checked(cls, temperature=None, top_k=None, top_p=None, min_p=None) -> Sampling:
        """The settings as transformers reads a GenerationConfig's (None: the warper is off),
        each checked: a temperature of 0 (greedy, in other libraries) is refused here, as
        transformers refuses it, rather than dividing by it."""
        if top_k is not None and (not isinstance(top_k, numbers.Integral)
                                  or isinstance(top_k, bool) or top_k < 0):
            raise ArgumentError(f"generate: top_k must be an int >= 0 (0 or None: no top-k), "
                                f"got {top_k!r}")
        return cls(
            1.0 if temperature is None else _number(
                "temperature (> 0; do_sample=False decodes greedily)", temperature, 0.0,
                np.inf, open_low=True),
            0 if top_k is None else int(top_k),
            1.0 if top_p is None else _number("top_p", top_p, 0.0, 1.0),
            None if min_p is None else _number("min_p", min_p, 0.0, 1.0))

    def filtered(self, scores: np.ndarray) -> np.ndarray:
        """``scores`` (batch, vocab) in float64 after the warpers, the tokens they remove at
        -inf. Each warper keeps at least one token, as transformers' do."""
        s = np.array(scores, dtype=np.float64)
        vocab = s.shape[-1]
        if self.temperature != 1.0:
            s /= self.temperature
        if 0 < self.top_k < vocab:  # ties with the k-th best stay, as torch.topk's threshold
            kth = np.partition(s, vocab - self.top_k, axis=-1)[:, vocab - self.top_k, None]
            s[s < kth] = -np.inf
        if self.top_p < 1.0:  # ascending: drop the worst whose summed share is <= 1 - top_p
            order = np.argsort(s, axis=-1, kind="stable")
            ranked = np.take_along_axis(s, order, axis=-1)
            gone = np.cumsum(_softmax(ranked), axis=-1) <= 1.0 - self.top_p
            gone[:, -1] = False
            np.put_along_axis(s, order, np.where(gone, -np.inf, ranked), axis=-1)
        if self.min_p is not None:
            probs = _softmax(s)
            gone = probs < self.min_p * probs.max(axis=-1, keepdims=True)
            gone[np.arange(len(s)), probs.argmax(axis=-1)] = False
            s[gone] = -np.inf
        return s

    def choose(self, scores: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One token per row, (batch,) int64, drawn from the softmax of ``filtered(scores)``."""
        cumulative = np.cumsum(_softmax(self.filtered(scores)), axis=-1)
        point = rng.random((len(cumulative), 1)) * cumulative[:, -1:]
        token = (cumulative <= point).sum(axis=-1)
        return np.minimum(token, cumulative.shape[-1] - 1).astype(np.int64)


def _softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
