"""GPT-2 generation for ``tg run gpt2``. No GPT-2 weights ship in a package this project can
install offline, so the model is transformers' GPT-2 architecture (124M by default) with
random weights from a fixed seed: the tokens are meaningless, the work is real."""

from __future__ import annotations

import numpy as np


def random_gpt2(layers: int = 12, seed: int = 0):
    """transformers' GPT2LMHeadModel at its default (124M) sizes, random weights, eval mode;
    no eos token, so generation always runs to the requested length."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(n_layer=layers, bos_token_id=None, eos_token_id=None)
    return GPT2LMHeadModel(config).eval()


def random_prompt(length: int, vocab: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, (1, length))
