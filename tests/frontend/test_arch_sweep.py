"""A breadth sweep of transformers architectures called as users call them, through
``tg.from_torch``: the model itself (not a wrapper), every argument at its default (a causal
LM's ``use_cache=True``: the returned DynamicCache must have torch's shapes), a padded
``attention_mask`` where the model takes one. Tiny random configs (1-2 layers, hidden
16-64): nothing is downloaded. The main output (logits, last_hidden_state) is within 1e-4
of eager, the one error measure (float64 reference of torch's float32 result).

What made some of them import (each case below fails without its fix):

- a model that returns its cache and needs torch's retrace (Cohere's and Helium's
  ``repeat_interleave``, DeepSeek-V3's ``new_empty``, GPT-OSS's write into a view,
  LongT5's and ProphetNet's ``einsum``): torch's retrace rebuilds the cache inside the
  traced forward, whose fresh constants it loses; the retrace returns flat outputs
  (``decompose._with_out_spec``);
- sliding-window caches (Mistral, Gemma2, Starcoder2) ``detach_`` a fresh ``torch.tensor``
  and read it through ``.to``; ``detach_`` rewrites metadata only (torch tags it
  ``inplace_view``), so it is no write through a view and needs no retrace
  (``aten.writes_values``; these refused before either fix);
- XLM and FlauBERT check ``assert lengths.max().item() <= slen``: a tensor's value read as
  a number passes through torch.export's own checks (``shape_ops._read_value``);
- EfficientNet's head pools a map smaller than its kernel in ``ceil_mode``: torch's one
  window is clipped to the input (``nn_ops._ceil_kernel``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.errors import ArgumentError
from tensor_graphs.numerics import relative_error

torch = pytest.importorskip("torch")
T = pytest.importorskip("transformers")

TOL = 1e-4
V = 97
B, N = 2, 8


def _ids(n: int = N) -> torch.Tensor:
    return torch.randint(3, V, (B, n))


def _mask(left: bool) -> torch.Tensor:
    """Generation's left padding (causal LMs) or an encoder batch's right padding."""
    mask = torch.ones(B, N, dtype=torch.int64)
    mask[1, slice(0, 3) if left else slice(N - 3, N)] = 0
    return mask


def _pixels(size: int = 32) -> dict:
    return {"pixel_values": torch.randn(B, 3, size, size)}


LM = dict(num_hidden_layers=2, vocab_size=V, hidden_size=64, intermediate_size=128,
          num_attention_heads=4, max_position_embeddings=64)
ENC = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
           intermediate_size=64, max_position_embeddings=64)
S2S = dict(vocab_size=V, d_model=32, encoder_layers=1, decoder_layers=1,
           encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
           decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=1, bos_token_id=0,
           eos_token_id=2, decoder_start_token_id=2)
T5 = dict(vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4,
          relative_attention_num_buckets=8, relative_attention_max_distance=16)
VIT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
           image_size=32, patch_size=8)
AUDIO = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
             num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4)


def lm(model, config, **extra) -> Callable:
    """A causal LM: ids and a left-padded mask."""
    return lambda: (model(config(**{**LM, **extra})),
                    {"input_ids": _ids(), "attention_mask": _mask(left=True)})


def text(model, config, **fields) -> Callable:
    """An encoder: ids and a right-padded mask."""
    return lambda: (model(config(**fields)),
                    {"input_ids": _ids(), "attention_mask": _mask(left=False)})


def enc(model, config, **extra) -> Callable:
    return text(model, config, **{**ENC, **extra})


def s2s(model, config, **fields) -> Callable:
    """An encoder-decoder: the encoder's ids and mask, the decoder's ids."""
    return lambda: (model(config(**fields)),
                    {"input_ids": _ids(), "attention_mask": _mask(left=False),
                     "decoder_input_ids": _ids(5)})


def vision(model, config, **fields) -> Callable:
    return lambda: (model(config(**fields)), _pixels())


def audio(model, config, **extra) -> Callable:
    return lambda: (model(config(**{**AUDIO, **extra})), {"input_values": torch.randn(B, 400)})


CASES: dict[str, Callable] = {
    # BERT-family encoders
    "roberta": enc(T.RobertaModel, T.RobertaConfig, pad_token_id=1),
    "xlm_roberta": enc(T.XLMRobertaModel, T.XLMRobertaConfig, pad_token_id=1),
    "distilbert": text(T.DistilBertModel, T.DistilBertConfig, vocab_size=V, dim=32,
                       n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64),
    "albert": enc(T.AlbertModel, T.AlbertConfig, embedding_size=16),
    "electra": enc(T.ElectraModel, T.ElectraConfig, embedding_size=16),
    "deberta_v2": enc(T.DebertaV2Model, T.DebertaV2Config, relative_attention=True,
                      position_buckets=8, max_relative_positions=16,
                      pos_att_type=["p2c", "c2p"]),
    "deberta": enc(T.DebertaModel, T.DebertaConfig, relative_attention=True,
                   max_relative_positions=16, pos_att_type=["p2c", "c2p"]),
    "mpnet": enc(T.MPNetModel, T.MPNetConfig),
    "roformer": enc(T.RoFormerModel, T.RoFormerConfig),
    "convbert": enc(T.ConvBertModel, T.ConvBertConfig, embedding_size=32),
    "squeezebert": enc(T.SqueezeBertModel, T.SqueezeBertConfig, embedding_size=32),
    "esm": enc(T.EsmModel, T.EsmConfig, pad_token_id=1, position_embedding_type="rotary"),
    "xlnet": text(T.XLNetModel, T.XLNetConfig, vocab_size=V, d_model=32, n_layer=2,
                  n_head=4, d_inner=64),
    "xlm": text(T.XLMModel, T.XLMConfig, vocab_size=V, emb_dim=32, n_layers=2, n_heads=4,
                max_position_embeddings=64),
    "flaubert": text(T.FlaubertModel, T.FlaubertConfig, vocab_size=V, emb_dim=32,
                     n_layers=2, n_heads=4, max_position_embeddings=64),
    "funnel": text(T.FunnelModel, T.FunnelConfig, vocab_size=V, d_model=32, n_head=4,
                   d_head=8, d_inner=64, block_sizes=[1, 1], num_decoder_layers=1),
    # encoder-decoders
    "bart": s2s(T.BartModel, T.BartConfig, **S2S),
    "mbart": s2s(T.MBartModel, T.MBartConfig, **S2S),
    "marian": s2s(T.MarianMTModel, T.MarianConfig, **S2S),
    "pegasus": s2s(T.PegasusModel, T.PegasusConfig, **S2S),
    "m2m100": s2s(T.M2M100Model, T.M2M100Config, **S2S),
    "t5": s2s(T.T5ForConditionalGeneration, T.T5Config, **T5, decoder_start_token_id=0),
    "longt5": s2s(T.LongT5Model, T.LongT5Config, **T5, local_radius=2),
    "prophetnet": s2s(T.ProphetNetModel, T.ProphetNetConfig, vocab_size=V, hidden_size=32,
                      encoder_ffn_dim=64, decoder_ffn_dim=64, num_encoder_layers=1,
                      num_decoder_layers=1, num_encoder_attention_heads=4,
                      num_decoder_attention_heads=4, ngram=2, num_buckets=8,
                      relative_max_distance=16, max_position_embeddings=64),
    # causal LMs
    "opt": lm(T.OPTForCausalLM, T.OPTConfig, ffn_dim=128, word_embed_proj_dim=64),
    "bloom": lambda: (T.BloomForCausalLM(T.BloomConfig(vocab_size=V, hidden_size=64,
                                                       n_layer=2, n_head=4)),
                      {"input_ids": _ids(), "attention_mask": _mask(left=True)}),
    "gpt_neo": lm(T.GPTNeoForCausalLM, T.GPTNeoConfig, num_layers=2, num_heads=4,
                  attention_types=[[["global", "local"], 1]], window_size=4),
    "gpt_neox": lm(T.GPTNeoXForCausalLM, T.GPTNeoXConfig),
    "gpt_bigcode": lm(T.GPTBigCodeForCausalLM, T.GPTBigCodeConfig, n_embd=64, n_layer=2,
                      n_head=4, n_positions=64),
    "phi": lm(T.PhiForCausalLM, T.PhiConfig),
    "phi3": lm(T.Phi3ForCausalLM, T.Phi3Config, pad_token_id=0),
    "qwen2": lm(T.Qwen2ForCausalLM, T.Qwen2Config, num_key_value_heads=2),
    "stablelm": lm(T.StableLmForCausalLM, T.StableLmConfig, num_key_value_heads=4),
    "gemma": lm(T.GemmaForCausalLM, T.GemmaConfig, head_dim=16, num_key_value_heads=1),
    "olmo": lm(T.OlmoForCausalLM, T.OlmoConfig),
    "mistral": lm(T.MistralForCausalLM, T.MistralConfig, num_key_value_heads=2,
                  sliding_window=4),
    "gemma2": lm(T.Gemma2ForCausalLM, T.Gemma2Config, head_dim=16, num_key_value_heads=2,
                 sliding_window=4),
    "starcoder2": lm(T.Starcoder2ForCausalLM, T.Starcoder2Config, num_key_value_heads=2,
                     sliding_window=4),
    "cohere": lm(T.CohereForCausalLM, T.CohereConfig, num_key_value_heads=2),
    "helium": lm(T.HeliumForCausalLM, T.HeliumConfig, num_key_value_heads=2, head_dim=16),
    "deepseek_v3": lm(T.DeepseekV3ForCausalLM, T.DeepseekV3Config, num_key_value_heads=4,
                      n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      first_k_dense_replace=1, n_group=1, topk_group=1, kv_lora_rank=16,
                      q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                      v_head_dim=16),
    "gpt_oss": lm(T.GptOssForCausalLM, T.GptOssConfig, num_key_value_heads=2, head_dim=16,
                  num_local_experts=4, num_experts_per_tok=2, sliding_window=4),
    # vision
    "clip_text": text(T.CLIPTextModel, T.CLIPTextConfig, **ENC),
    "clip_vision": vision(T.CLIPVisionModel, T.CLIPVisionConfig, **VIT),
    "siglip_vision": vision(T.SiglipVisionModel, T.SiglipVisionConfig, **VIT),
    "deit": vision(T.DeiTModel, T.DeiTConfig, **VIT),
    "beit": vision(T.BeitModel, T.BeitConfig, **VIT, use_relative_position_bias=True),
    "dinov2": vision(T.Dinov2Model, T.Dinov2Config, **VIT),
    "convnext": vision(T.ConvNextModel, T.ConvNextConfig, hidden_sizes=[16, 32],
                       depths=[1, 1], num_stages=2),
    "resnet": vision(T.ResNetModel, T.ResNetConfig, embedding_size=16, hidden_sizes=[16, 32],
                     depths=[1, 1], layer_type="basic"),
    "swin": vision(T.SwinModel, T.SwinConfig, image_size=32, patch_size=4, embed_dim=16,
                   depths=[1, 1], num_heads=[2, 4], window_size=4),
    "segformer": vision(T.SegformerModel, T.SegformerConfig, num_encoder_blocks=2,
                        depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                        patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2],
                        mlp_ratios=[2, 2]),
    "efficientnet": vision(T.EfficientNetModel, T.EfficientNetConfig, image_size=32,
                           width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320),
    # audio
    "hubert": audio(T.HubertModel, T.HubertConfig),
    "wavlm": audio(T.WavLMModel, T.WavLMConfig, num_buckets=16, max_bucket_distance=32),
    "whisper": lambda: (T.WhisperForConditionalGeneration(T.WhisperConfig(
        num_mel_bins=8, d_model=32, encoder_layers=1, encoder_attention_heads=4,
        encoder_ffn_dim=64, decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=64,
        max_source_positions=16, vocab_size=V, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, decoder_start_token_id=1)),
        {"input_features": torch.randn(B, 8, 32), "decoder_input_ids": _ids(5)}),
}

# each takes over ~8 s on one core (ProphetNet's and DeepSeek-V3's retraces, GPT-OSS's experts)
SLOW = {"prophetnet", "deepseek_v3", "gpt_oss", "longt5"}

# the output a model's own computation ends in (EfficientNet's pooler: the ceil-mode pool)
MAIN = {"efficientnet": "pooler_output"}


def _main(name: str, out):
    key = MAIN.get(name) or ("logits" if getattr(out, "logits", None) is not None
                             else "last_hidden_state")
    return getattr(out, key)


def _cache_shapes(out) -> list:
    """The shapes of a returned cache's tensors (an EncoderDecoderCache's two), layer by
    layer; [] without one."""
    cache = getattr(out, "past_key_values", None)
    if cache is None:
        return []
    caches = [cache.self_attention_cache, cache.cross_attention_cache] \
        if hasattr(cache, "cross_attention_cache") else [cache]
    return [tuple(t.shape) for c in caches for layer in c.layers
            for t in (layer.keys, layer.values)]


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW
                                  else n for n in CASES])
def test_architecture_called_as_users_call_it(name):
    torch.manual_seed(0)
    model, kwargs = CASES[name]()
    model.eval()
    with torch.no_grad():
        ref = model(**kwargs)
    got = tg.from_torch(model, (), kwargs=kwargs, db=":memory:")(**kwargs)
    want = _main(name, ref).detach().double().numpy()
    mine = _main(name, got)
    assert isinstance(mine, np.ndarray) and mine.shape == want.shape, (mine.shape, want.shape)
    err = relative_error(mine.astype(np.float64), want)
    assert err < TOL, err
    assert _cache_shapes(got) == _cache_shapes(ref)


# ---------------------------------------------------------------------------- the fixes alone
class _Pool(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


F = torch.nn.functional


@pytest.mark.parametrize("fn, shape", [
    (lambda x: F.avg_pool2d(x, 5, ceil_mode=True), (2, 3, 3, 4)),
    (lambda x: F.avg_pool2d(x, 5, padding=1, ceil_mode=True), (2, 3, 2, 2)),
    (lambda x: F.avg_pool2d(x, 5, padding=1, ceil_mode=True, count_include_pad=False),
     (2, 3, 2, 2)),
    (lambda x: F.avg_pool2d(x, (7, 2), stride=(8, 2), ceil_mode=True), (2, 3, 3, 5)),
    (lambda x: F.max_pool2d(x, 6, ceil_mode=True), (2, 3, 3, 4)),
    (lambda x: F.avg_pool1d(x, 9, ceil_mode=True), (2, 3, 5)),
])
def test_ceil_mode_window_past_the_input_is_clipped_to_it(fn, shape):
    """torch's ceil mode gives one window where the kernel reaches past the padded input,
    clipped at its end (its divisor too)."""
    x = torch.randn(*shape)
    got = tg.from_torch(_Pool(fn), (x,), db=":memory:")(x)
    ref = fn(x).double().numpy()
    assert got.shape == ref.shape
    assert relative_error(got.astype(np.float64), ref) < 1e-6


class _Checked(torch.nn.Module):
    """A value read as a number: checked (XLM's assert) or used as a scalar."""

    def __init__(self, use: bool):
        super().__init__()
        self.use = use

    def forward(self, x, mask):
        longest = mask.sum(1).max().item()
        if self.use:
            return x * longest
        torch._check(longest <= x.shape[1])  # what XLM's assert on .item() exports as
        return x * 2


def test_a_value_read_as_a_number_passes_checks_and_is_refused_where_used():
    x, mask = torch.randn(2, 5), torch.ones(2, 5, dtype=torch.int64)
    prog = tg.from_torch(_Checked(use=False), (x, mask), db=":memory:")
    assert np.allclose(prog(x, mask), (x * 2).numpy())
    with pytest.raises(ArgumentError, match=r"_local_scalar_dense.*Keep it a tensor"):
        tg.from_torch(_Checked(use=True), (x, mask), db=":memory:")


class _Detached(torch.nn.Module):
    """What transformers' sliding-window cache layers do: ``detach_`` a fresh tensor and
    read it through ``.to``."""

    def forward(self, x):
        t = torch.tensor(2, dtype=torch.long)
        t.detach_()
        return x * t.to(x.device)


def test_detach_is_no_write_through_a_view():
    """``detach_`` rewrites metadata only, so the program needs no functional retrace."""
    from tensor_graphs.frontend.decompose import writes_through_views

    x = torch.randn(3)
    exported = torch.export.export(_Detached(), (x,))
    assert any(n.target is torch.ops.aten.detach_.default for n in exported.graph.nodes)
    assert writes_through_views(exported) == []
    assert np.allclose(tg.from_torch(exported, (x,), db=":memory:")(x), (2 * x).numpy())
