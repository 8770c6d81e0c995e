"""``tg.nn``: layers that build tensor graphs, and language models made of them.

A layer holds its sizes and the name prefix of its weights; calling it on nodes returns nodes::

    import tensor_graphs as tg
    model = tg.nn.GPT2(tg.nn.GPT2Config(n_layer=2))
    logits = model()                       # input_ids (batch, seq), symbolic
    prog = tg.compile(logits, bounds={"batch": 1, "seq": 128})
    prog.bind_safetensors("gpt2.safetensors")   # transformers' state-dict names

Modules: ``layers`` (Linear, Embedding, LayerNorm, RMSNorm, MLP), ``attention``
(MultiHeadAttention, RotaryEmbedding and its RopeScaling, KVCache), ``models``
(TransformerBlock, GPT2, Llama),
``generate`` (Generator: prefill and decode programs over one KV cache; ``tg.generate``).
"""

from tensor_graphs.nn.attention import (
    KVCache,
    MultiHeadAttention,
    RopeScaling,
    RotaryEmbedding,
    positions,
)
from tensor_graphs.nn.generate import ARCHITECTURES, Generator
from tensor_graphs.nn.layers import ACTIVATIONS, MLP, Embedding, LayerNorm, Linear, RMSNorm
from tensor_graphs.nn.models import (
    GPT2,
    GPT2Config,
    Llama,
    LlamaConfig,
    TransformerBlock,
    input_ids,
)

__all__ = [
    "Linear", "Embedding", "LayerNorm", "RMSNorm", "MLP", "ACTIVATIONS", "MultiHeadAttention",
    "RotaryEmbedding", "RopeScaling", "KVCache", "positions", "TransformerBlock", "GPT2",
    "GPT2Config", "Llama", "LlamaConfig", "input_ids", "Generator", "ARCHITECTURES",
]
