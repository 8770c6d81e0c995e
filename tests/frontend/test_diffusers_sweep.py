"""A breadth sweep of diffusers models called as users call them, through ``tg.from_torch``:
UNets (2-d with cross-attention, class and SDXL-style added embeddings; 1-d; 3-d and
spatio-temporal video UNets), autoencoders (KL, VQ, tiny, temporal decoder), the diffusion
transformers (DiT, PixArt, SD3's MMDiT, Flux, AuraFlow, Sana, HunyuanDiT, CogVideoX), ControlNets,
the unCLIP prior, a scheduler's denoising loop around a compiled UNet and a symbolic batch.
Tiny random configs: nothing is downloaded. The main output is within 1e-4 of eager (float64
reference of torch's float32 result).

What made some of them import (each case below fails without its fix):

- the video UNets' temporal convolutions and the temporal decoder are 3-d convolutions: one
  conv2d over the output frames, each frame's depth window stacked into the channels
  (``nn_ops._conv3d``);
- ``repeat_interleave`` with one count (attention masks per head, Flux's rotary tables),
  ``unflatten`` (Flux's and Sana's heads), ``broadcast_to`` and ``concat`` map whole, so a
  model using them needs no retrace through torch's decompositions
  (``shape_ops._repeat_interleave``, ``_unflatten``).

AuraFlow is called with timesteps in [0, 1], as its pipeline calls it: at t = 500 its
``Timesteps(scale=1000)`` takes sines of ~5e5 rad, where one float32 rounding of the
argument (our constant folding of the frequency table in float64 versus torch's float32)
moves the output by 2e-4.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.frontend.decompose import unmapped
from tensor_graphs.numerics import relative_error

torch = pytest.importorskip("torch")
D = pytest.importorskip("diffusers")

TOL = 1e-4
B = 2


def _latents(channels: int = 4, size: int = 16) -> torch.Tensor:
    return torch.randn(B, channels, size, size)


def _text(n: int = 7, width: int = 32) -> torch.Tensor:
    return torch.randn(B, n, width)


def _t() -> torch.Tensor:
    return torch.tensor([10, 500])


class _Method(torch.nn.Module):
    """A model's method (``vae.decode``) as a forward: what a pipeline calls."""

    def __init__(self, model, fn: Callable):
        super().__init__()
        self.model, self.fn = model, fn

    def forward(self, *args):
        return self.fn(self.model, *args)


def _nonzero(model):
    """ControlNets zero-initialise their output projections (so a fresh one adds nothing):
    random values make the compared output something other than zeros."""
    with torch.no_grad():
        for p in model.parameters():
            if not p.any():
                p.normal_(0, 0.1)
    return model


def unet2d(**extra):
    return D.UNet2DConditionModel(**{
        **dict(sample_size=16, in_channels=4, out_channels=4, layers_per_block=1,
               block_out_channels=(32, 64), norm_num_groups=8, attention_head_dim=8,
               cross_attention_dim=32, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
               up_block_types=("UpBlock2D", "CrossAttnUpBlock2D")), **extra})


def unet3d():
    return D.UNet3DConditionModel(
        block_out_channels=(8, 16), norm_num_groups=4, layers_per_block=1, sample_size=8,
        down_block_types=("CrossAttnDownBlock3D", "DownBlock3D"), in_channels=4,
        up_block_types=("UpBlock3D", "CrossAttnUpBlock3D"), cross_attention_dim=8,
        attention_head_dim=4, out_channels=4)


def vae():
    return D.AutoencoderKL(block_out_channels=(32, 64), latent_channels=4, norm_num_groups=8,
                           down_block_types=("DownEncoderBlock2D",) * 2,
                           up_block_types=("UpDecoderBlock2D",) * 2, sample_size=16)


MMDIT = dict(sample_size=8, patch_size=2, in_channels=4, attention_head_dim=8,
             num_attention_heads=2, joint_attention_dim=32, caption_projection_dim=16,
             out_channels=4)
FLUX = dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
            attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
            pooled_projection_dim=32, axes_dims_rope=(4, 4, 8))


def _flux_inputs(**extra) -> dict:
    return {"hidden_states": torch.randn(B, 16, 4), "encoder_hidden_states": _text(),
            "pooled_projections": torch.randn(B, 32), "timestep": torch.tensor([0.1, 0.5]),
            "img_ids": torch.randn(16, 3), "txt_ids": torch.zeros(7, 3), **extra}


# name -> () -> (model, positional args, keyword args, the output compared: an attribute, or
# None for the first tensor returned)
CASES: dict[str, Callable] = {
    "unet2d_condition": lambda: (unet2d(), (_latents(), _t(), _text()), {}, "sample"),
    "unet2d_condition_int_timestep": lambda: (unet2d(), (_latents(), 10, _text()), {},
                                              "sample"),
    "unet2d_condition_float_timestep": lambda: (unet2d(), (_latents(), 10.5, _text()), {},
                                                "sample"),
    "unet2d_condition_class_labels": lambda: (
        unet2d(num_class_embeds=10), (_latents(), _t(), _text()),
        {"class_labels": torch.tensor([1, 7])}, "sample"),
    "unet2d_condition_sdxl_text_time": lambda: (
        unet2d(addition_embed_type="text_time", addition_time_embed_dim=8,
               projection_class_embeddings_input_dim=32 + 6 * 8), (_latents(), _t(), _text()),
        {"added_cond_kwargs": {"text_embeds": torch.randn(B, 32),
                               "time_ids": torch.randn(B, 6)}}, "sample"),
    "unet2d_condition_text_mask": lambda: (
        unet2d(), (_latents(), _t(), _text()),
        {"encoder_attention_mask": torch.tensor([[1] * 7, [1] * 4 + [0] * 3])}, "sample"),
    "unet1d_dance": lambda: (
        D.UNet1DModel(block_out_channels=(32, 32, 64), extra_in_channels=16, in_channels=2,
                      out_channels=2, time_embedding_type="fourier", time_embedding_dim=16,
                      flip_sin_to_cos=True, use_timestep_embedding=False, sample_size=64,
                      mid_block_type="UNetMidBlock1D",
                      down_block_types=("DownBlock1DNoSkip", "DownBlock1D", "AttnDownBlock1D"),
                      up_block_types=("AttnUpBlock1D", "UpBlock1D", "UpBlock1DNoSkip")),
        (torch.randn(B, 2, 64), _t()), {}, "sample"),
    "unet1d_resnet": lambda: (
        D.UNet1DModel(block_out_channels=(32, 64), in_channels=14, out_channels=14,
                      time_embedding_type="positional", use_timestep_embedding=True,
                      flip_sin_to_cos=False, freq_shift=1.0, out_block_type="OutConv1DBlock",
                      mid_block_type="MidResTemporalBlock1D", layers_per_block=1,
                      down_block_types=("DownResnetBlock1D",) * 2,
                      up_block_types=("UpResnetBlock1D",), act_fn="swish", norm_num_groups=8,
                      sample_size=16),
        (torch.randn(B, 14, 16), _t()), {}, "sample"),
    "unet3d_condition": lambda: (unet3d(), (torch.randn(B, 4, 3, 8, 8), _t(), _text(5, 8)),
                                 {}, "sample"),
    "unet_spatio_temporal": lambda: (
        D.UNetSpatioTemporalConditionModel(
            block_out_channels=(32, 64), layers_per_block=1, sample_size=8, in_channels=8,
            out_channels=4, cross_attention_dim=32, num_attention_heads=(2, 4),
            down_block_types=("CrossAttnDownBlockSpatioTemporal", "DownBlockSpatioTemporal"),
            up_block_types=("UpBlockSpatioTemporal", "CrossAttnUpBlockSpatioTemporal"),
            projection_class_embeddings_input_dim=3 * 8, addition_time_embed_dim=8),
        (torch.randn(B, 3, 8, 8, 8), _t(), _text(1), torch.randn(B, 3)), {}, "sample"),
    "autoencoder_kl": lambda: (vae(), (torch.randn(B, 3, 16, 16),), {}, "sample"),
    "autoencoder_kl_encode_mode": lambda: (
        _Method(vae(), lambda m, x: m.encode(x).latent_dist.mode()),
        (torch.randn(B, 3, 16, 16),), {}, None),
    "autoencoder_kl_decode": lambda: (_Method(vae(), lambda m, z: m.decode(z).sample),
                                      (torch.randn(B, 4, 8, 8),), {}, None),
    "autoencoder_kl_temporal_decoder": lambda: (
        _Method(D.AutoencoderKLTemporalDecoder(
            block_out_channels=(32, 64), down_block_types=("DownEncoderBlock2D",) * 2,
            latent_channels=4, layers_per_block=1),
            lambda m, z: m.decode(z, num_frames=2).sample),
        (torch.randn(4, 4, 8, 8),), {}, None),
    "autoencoder_tiny": lambda: (
        D.AutoencoderTiny(encoder_block_out_channels=(16, 16),
                          decoder_block_out_channels=(16, 16), num_encoder_blocks=(1, 1),
                          num_decoder_blocks=(1, 1)), (torch.randn(B, 3, 16, 16),), {},
        "sample"),
    "vq_model": lambda: (
        D.VQModel(block_out_channels=(32, 64), down_block_types=("DownEncoderBlock2D",) * 2,
                  up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=3,
                  norm_num_groups=8, num_vq_embeddings=32, vq_embed_dim=3),
        (torch.randn(B, 3, 16, 16),), {}, "sample"),
    "transformer2d": lambda: (
        D.Transformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=16,
                             norm_num_groups=8, num_layers=1, cross_attention_dim=32),
        (torch.randn(B, 16, 8, 8),), {"encoder_hidden_states": _text()}, "sample"),
    "dit": lambda: (
        D.DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4,
                                out_channels=8, num_layers=1, sample_size=8, patch_size=2),
        (_latents(size=8), _t(), torch.tensor([1, 3])), {}, "sample"),
    "pixart": lambda: (
        D.PixArtTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4,
                                   out_channels=8, num_layers=1, sample_size=8, patch_size=2,
                                   cross_attention_dim=16, caption_channels=32),
        (_latents(size=8),), {"encoder_hidden_states": _text(), "timestep": _t(),
                              "added_cond_kwargs": {"resolution": None,
                                                    "aspect_ratio": None}}, "sample"),
    "sd3": lambda: (
        D.SD3Transformer2DModel(**MMDIT, num_layers=2, pooled_projection_dim=16,
                                pos_embed_max_size=16),
        (_latents(size=8), _text(), torch.randn(B, 16), _t()), {}, "sample"),
    "sd3_controlnet": lambda: (
        _nonzero(D.SD3ControlNetModel(**MMDIT, num_layers=1, pooled_projection_dim=16,
                                      pos_embed_max_size=16)),
        (_latents(size=8), _latents(size=8), 1.0, _text(), torch.randn(B, 16), _t()), {}, None),
    "flux": lambda: (D.FluxTransformer2DModel(**FLUX), (), _flux_inputs(), "sample"),
    "flux_guidance": lambda: (D.FluxTransformer2DModel(**FLUX, guidance_embeds=True), (),
                              _flux_inputs(guidance=torch.tensor([3.5, 3.5])), "sample"),
    "auraflow": lambda: (
        D.AuraFlowTransformer2DModel(**MMDIT, num_mmdit_layers=1, num_single_dit_layers=1,
                                     pos_embed_max_size=64),
        (_latents(size=8), _text(), torch.tensor([0.01, 0.5])), {}, "sample"),
    "sana": lambda: (
        D.SanaTransformer2DModel(in_channels=4, out_channels=4, num_attention_heads=2,
                                 attention_head_dim=8, num_layers=1, num_cross_attention_heads=2,
                                 cross_attention_head_dim=8, cross_attention_dim=16,
                                 caption_channels=32, sample_size=8, patch_size=1),
        (_latents(size=8), _text(), _t()), {}, "sample"),
    "hunyuan_dit": lambda: (
        D.HunyuanDiT2DModel(sample_size=8, patch_size=2, in_channels=4, num_layers=2,
                            attention_head_dim=8, num_attention_heads=2, hidden_size=16,
                            cross_attention_dim=32, cross_attention_dim_t5=32,
                            pooled_projection_dim=16, text_len=7, text_len_t5=5),
        (_latents(size=8), torch.tensor([10.0, 500.0]), _text(),
         torch.ones(B, 7, dtype=torch.bool), _text(5), torch.ones(B, 5, dtype=torch.bool),
         torch.randn(B, 6), torch.tensor([0, 0])),
        {"image_rotary_emb": (torch.randn(16, 8), torch.randn(16, 8))}, "sample"),
    "cogvideox": lambda: (
        D.CogVideoXTransformer3DModel(num_attention_heads=2, attention_head_dim=8,
                                      in_channels=4, out_channels=4, time_embed_dim=4,
                                      text_embed_dim=32, num_layers=1, sample_width=8,
                                      sample_height=8, sample_frames=9, patch_size=2,
                                      temporal_compression_ratio=4, max_text_seq_length=7),
        (torch.randn(B, 3, 4, 8, 8), _text(), _t()), {}, "sample"),
    "controlnet": lambda: (
        _nonzero(D.ControlNetModel(block_out_channels=(32, 64), layers_per_block=1,
                                   down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                   cross_attention_dim=32, norm_num_groups=8,
                                   conditioning_embedding_out_channels=(16, 32),
                                   attention_head_dim=8)),
        (_latents(), _t(), _text(), torch.randn(B, 3, 32, 32)), {}, "mid_block_res_sample"),
    "prior": lambda: (
        D.PriorTransformer(num_attention_heads=2, attention_head_dim=4, num_layers=2,
                           embedding_dim=8, num_embeddings=7, additional_embeddings=4),
        (torch.randn(B, 8), _t(), torch.randn(B, 8), torch.randn(B, 7, 8)),
        {"attention_mask": torch.tensor([[True] * 7, [True] * 4 + [False] * 3])},
        "predicted_image_embedding"),
    "uvit2d": lambda: (
        D.UVit2DModel(hidden_size=32, in_channels=8, block_out_channels=16, num_res_blocks=1,
                      num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                      codebook_size=16, vocab_size=17, encoder_hidden_size=32,
                      cond_embed_dim=32, micro_cond_encode_dim=2, micro_cond_embed_dim=10,
                      sample_size=4, use_bias=False),
        (torch.randint(0, 16, (B, 4, 4)), _text(), torch.randn(B, 32), torch.randn(B, 5)), {},
        None),
}

# each takes over ~10 s on one core (mostly planning the larger graphs)
SLOW = {"unet1d_dance", "unet3d_condition", "unet_spatio_temporal"}


def _main(out, key):
    """The compared output: ``key``'s attribute, else the first tensor returned."""
    if key is not None:
        return getattr(out, key)
    while isinstance(out, (tuple, list)) or hasattr(out, "to_tuple"):
        out = out.to_tuple()[0] if hasattr(out, "to_tuple") else out[0]
    return out


def _check(got, ref) -> None:
    want = ref.detach().double().numpy()
    mine = np.asarray(got)
    assert mine.shape == want.shape, (mine.shape, want.shape)
    err = relative_error(mine.astype(np.float64), want)
    assert err < TOL, err


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW
                                  else n for n in CASES])
def test_diffusers_model_called_as_users_call_it(name):
    torch.manual_seed(0)
    model, args, kwargs, key = CASES[name]()
    model.eval()
    with torch.no_grad():
        ref = _main(model(*args, **kwargs), key)
    got = tg.from_torch(model, args, kwargs=kwargs, db=":memory:")(*args, **kwargs)
    _check(_main(got, key), ref)


@pytest.mark.parametrize("scheduler", ["DDIMScheduler", "EulerDiscreteScheduler"])
def test_scheduler_loop_around_the_compiled_unet(scheduler):
    """A few denoising steps: the scheduler runs in torch, the UNet compiled, fed each
    step's timestep (a 0-d tensor, float for Euler) and ``scale_model_input``'s latents."""
    torch.manual_seed(0)
    model, text = unet2d().eval(), _text()
    make = getattr(D, scheduler)

    def denoise(unet) -> torch.Tensor:
        sched = make(num_train_timesteps=1000)
        sched.set_timesteps(3)
        x = torch.randn(B, 4, 16, 16, generator=torch.Generator().manual_seed(1)) \
            * sched.init_noise_sigma
        for t in sched.timesteps:
            eps = torch.as_tensor(unet(sched.scale_model_input(x, t), t, text).sample)
            x = sched.step(eps, t, x).prev_sample
        return x

    sched = make(num_train_timesteps=1000)
    sched.set_timesteps(3)
    prog = tg.from_torch(model, (_latents(), sched.timesteps[0], text), db=":memory:")
    with torch.no_grad():
        ref = denoise(model)
    _check(denoise(prog).numpy(), ref)


@pytest.mark.parametrize("name, spec", [
    ("unet2d_condition", lambda b: ({0: b}, {0: b}, {0: b})),
    pytest.param("unet3d_condition", lambda b: ({0: b}, {0: b}, {0: b}),
                 marks=pytest.mark.slow),
    ("flux", lambda b: {k: {0: b} for k in ("hidden_states", "encoder_hidden_states",
                                            "pooled_projections", "timestep")}),
])
def test_symbolic_batch(name, spec):
    """Exported at batch 2 with ``Dim("batch")``, called at 1 and 3 (3-d convolutions fold
    the batch into their conv2d's images: a size expression of the symbol)."""
    torch.manual_seed(0)
    model, args, kwargs, key = CASES[name]()
    model.eval()
    batch = torch.export.Dim("batch", max=4)
    prog = tg.from_torch(model, args, spec(batch), kwargs=kwargs, db=":memory:")
    for b in (1, 3):
        resized = _batch(args, b), {k: _batch(v, b) for k, v in kwargs.items()}
        with torch.no_grad():
            ref = _main(model(*resized[0], **resized[1]), key)
        _check(_main(prog(*resized[0], **resized[1]), key), ref)


def _batch(value, b: int):
    """``value`` (a tensor, or a tuple of them) at batch ``b``: fresh values for float
    inputs, the first row repeated for integer ones; inputs without the batch as they are."""
    if isinstance(value, tuple):
        return tuple(_batch(v, b) for v in value)
    if not isinstance(value, torch.Tensor) or value.ndim == 0 or value.shape[0] != B:
        return value
    if value.is_floating_point():
        return torch.randn(b, *value.shape[1:])
    return value[:1].repeat(b, *[1] * (value.ndim - 1))


# ---------------------------------------------------------------------------- the fixes alone
class _Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


F = torch.nn.functional


@pytest.mark.parametrize("x, w, options", [
    ((2, 4, 5, 6, 7), (6, 4, 3, 1, 1), dict(padding=(1, 0, 0))),  # a temporal conv
    ((2, 4, 5, 6, 7), (6, 2, 3, 3, 2), dict(stride=(2, 1, 2), padding=(1, 1, 0),
                                            dilation=(1, 2, 1), groups=2)),
    ((4, 5, 6, 7), (6, 4, 2, 3, 3), dict(padding="same")),  # unbatched, asymmetric padding
    ((1, 4, 5, 6, 7), (4, 1, 3, 3, 3), dict(groups=4, dilation=2, padding=2)),
])
def test_conv3d_matches_torch(x, w, options):
    """A 3-d convolution is one conv2d over the output frames (``nn_ops._conv3d``)."""
    x, w = torch.randn(*x), torch.randn(*w)
    bias = torch.randn(w.shape[0])
    fn = _Fn(lambda a, k, c: F.conv3d(a, k, c, **options))
    got = tg.from_torch(fn, (x, w, bias), db=":memory:")(x, w, bias)
    _check(got, fn(x, w, bias))


@pytest.mark.parametrize("fn, shapes", [
    (lambda x: x.repeat_interleave(3, dim=1), [(2, 4, 5)]),
    (lambda x: x.repeat_interleave(2), [(2, 3)]),
    (lambda x: x.repeat_interleave(2, dim=-1, output_size=10), [(2, 5)]),
    (lambda x: x.unflatten(2, (2, -1)), [(2, 3, 8)]),
    (lambda x: torch.broadcast_to(x, (4, 2, -1)), [(2, 1)]),
    (lambda a, b: torch.concat([a, b], dim=1), [(2, 3), (2, 4)]),
])
def test_view_like_ops_map_whole(fn, shapes):
    """Ops diffusers' attention and embeddings use map without torch's decomposition (whose
    retrace costs a second or more per model), with torch's values."""
    xs = tuple(torch.randn(*s) for s in shapes)
    exported = torch.export.export(_Fn(fn), xs)
    assert not unmapped(exported), [str(n.target) for n in unmapped(exported)]
    got = tg.from_torch(exported, xs, db=":memory:")(*xs)
    assert np.array_equal(got, fn(*xs).numpy())
