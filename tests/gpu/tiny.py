"""The tiny GPT-2 and Llama the GPU tests generate with: transformers' own modules, random
weights drawn under one seed, so a test compares its tokens with transformers' ``generate``
of the same model (``greedy``). Not a test module (pytest collects ``test_*.py`` only)."""

from __future__ import annotations

import numpy as np
import pytest
import torch


def greedy(lm, prompt: np.ndarray, tokens: int) -> np.ndarray:
    """transformers' greedy generation of ``tokens`` tokens after ``prompt`` (batch, length),
    every position attended: what a Generator of ``lm`` must return."""
    with torch.no_grad():
        ids = torch.from_numpy(prompt)
        return lm.generate(ids, max_new_tokens=tokens, do_sample=False, pad_token_id=0,
                           attention_mask=torch.ones_like(ids)).numpy()


def gpt2(n_layer: int = 1, n_embd: int = 32, n_positions: int = 64):
    """A GPT-2 of 211 tokens and 2 heads, no bos or eos (transformers' generate stops at
    neither), weights wide enough (initializer_range 0.3) that greedy tokens vary."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=n_embd, n_layer=n_layer, n_head=2, vocab_size=211,
                                  n_positions=n_positions, initializer_range=0.3,
                                  bos_token_id=None, eos_token_id=None)
    return transformers.GPT2LMHeadModel(cfg).eval()


def llama(n_layer: int = 2, eps: float = 1e-6):
    """A Llama of 211 tokens, 4 query heads over 2 kv heads, no bos or eos, weights wide
    enough (initializer_range 0.3) that greedy tokens vary; ``eps``: its RMSNorms'."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=211, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=n_layer, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64,
                                   rms_norm_eps=eps, initializer_range=0.3,
                                   bos_token_id=None, eos_token_id=None)
    return transformers.LlamaForCausalLM(cfg).eval()
