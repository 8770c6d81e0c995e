"""A diffusers UNet2DModel (random init) through tg.from_torch, compared with torch: conv,
group_norm, attention, nearest upsampling and the timestep embedding, each composite on a whole
kernel of its own."""

from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

import tensor_graphs as tg  # noqa: E402
from tensor_graphs.frontend import from_torch  # noqa: E402
from tensor_graphs.numerics import relative_error  # noqa: E402

TOL = 1e-4


def _unet(sample_size):
    torch.manual_seed(0)
    return diffusers.UNet2DModel(
        sample_size=sample_size, in_channels=3, out_channels=3, layers_per_block=1,
        block_out_channels=(32, 64), norm_num_groups=8, attention_head_dim=8,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D")).eval()


def _compare(prog, model, sample, timestep):
    got = prog(sample, timestep)
    with torch.no_grad():
        ref = model(sample, timestep).sample.numpy()
    assert isinstance(got.sample, np.ndarray) and got.sample.shape == ref.shape
    err = relative_error(got.sample, ref)
    assert err <= TOL, err
    return got.sample


@pytest.mark.parametrize("size", [16, 24])
def test_unet2d_matches_torch_on_two_timesteps(size):
    model = _unet(size)
    sample = torch.randn(2, 3, size, size)
    prog = from_torch(model, (sample, torch.tensor([10, 10])))
    outs = [_compare(prog, model, sample, torch.tensor(t)) for t in ([10, 10], [999, 3])]
    assert relative_error(outs[0], outs[1]) > 1e-3  # the timestep reaches the output

    # each group_norm, conv2d and attention is one whole kernel, not its decomposition
    steps = prog.plan.steps
    roots = Counter(s.computes for s in steps)
    modules = Counter(type(m).__name__ for m in model.modules())
    # a group norm is one whole kernel, or one generated row kernel (rows over the groups,
    # the per-channel affine, and the SiLU after it, in one step)
    rows = sum(1 for s in steps if s.kernel.name.startswith("c_row_"))
    assert roots["group_norm"] + rows == modules["GroupNorm"], (roots, rows)
    assert roots["conv2d"] == modules["Conv2d"], roots
    attention = sum(1 for m in model.modules() if type(m).__name__ == "Attention")
    assert attention and roots["scaled_dot_product_attention"] == attention, roots
    names = {"group_norm": "group_norm", "conv2d": "conv2d",
             "scaled_dot_product_attention": "attention"}
    for s in steps:
        if s.computes in names:
            assert names[s.computes] in s.kernel.name, (s.computes, s.kernel.name)
    # nearest upsampling reaches the planner whole (it may pick the whole kernel or the
    # reshape + expand decomposition, whichever costs less)
    graph = Counter(n.op.name for n in tg.nodes(prog.program._outputs))
    assert graph["interpolate"] == 1, graph
    assert not {"var", "mean"} & set(roots), roots  # no norm spelled out in atoms


def test_unet2d_dynamic_batch_plans_once():
    model = _unet(16)
    batch = torch.export.Dim("batch", max=4)
    sample, t = torch.randn(2, 3, 16, 16), torch.tensor([5, 7])
    prog = from_torch(model, (sample, t), dynamic_shapes=({0: batch}, {0: batch}))
    for b in (2, 1, 4):
        _compare(prog, model, torch.randn(b, 3, 16, 16), torch.arange(b) * 100 + 1)
    assert prog.program.stats["planner_runs"] == 1
