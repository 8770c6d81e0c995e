"""Architectures no issue names, through tg.from_torch and compared with torch on the same
(random) weights: a ResNet-style CNN, transformers' ViT and Whisper encoders, and two plain
torch models built from less common layers (sub-pixel upsampling, transposed convolution,
dilated causal 1-d convolution, instance norm, reflect padding and assorted activations).
Dims export marks dynamic stay symbolic: one plan serves every size."""

from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402,N812

from tensor_graphs.frontend import from_torch  # noqa: E402
from tensor_graphs.ir.graph import nodes  # noqa: E402
from tensor_graphs.numerics import relative_error  # noqa: E402

TOL = 1e-4
Dim = torch.export.Dim


def _close(got, ref):
    ref = ref.detach().numpy()
    assert isinstance(got, np.ndarray) and got.shape == ref.shape
    err = relative_error(got, ref)
    assert err <= TOL, err


def _roots(prog):
    return Counter(s.computes for s in prog.plan.steps)


# ---------------------------------------------------------------------------- ResNet-style CNN
class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        self.layers = nn.Sequential(BasicBlock(16, 16, 1), BasicBlock(16, 32, 2),
                                    BasicBlock(32, 32, 1))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))


def test_resnet_cnn_dynamic_batch(randomize_norms):
    torch.manual_seed(0)
    model = randomize_norms(ResNet()).eval()
    prog = from_torch(model, (torch.randn(2, 3, 32, 32),),
                      dynamic_shapes=({0: Dim("batch", max=8)},))
    for b in (2, 5, 1):
        x = torch.randn(b, 3, 32, 32)
        with torch.no_grad():
            _close(prog(x), model(x))
    assert prog.program.stats["planner_runs"] == 1
    roots = _roots(prog)
    modules = Counter(type(m).__name__ for m in model.modules())
    # the composites torch hands over whole reach the planner whole ...
    imported = Counter(n.op.name for n in nodes(prog.program._pipeline.outputs))
    assert imported["max_pool2d"] == 1 and imported["adaptive_avg_pool2d"] == 1, imported
    # ... and the plan keeps the ones whose kernels win (an adaptive average to 1 x 1 may
    # run as its decomposition's matmul, c_matmul_strided)
    assert roots["batch_norm"] + roots["conv2d"] >= modules["Conv2d"], roots
    assert roots["max_pool2d"] == 1, roots


class InPlace(nn.Module):
    """In-place ops (relu_, add_, mul_) stay in torch.export's graph and map through their
    functional forms; a read before the mutation keeps the old value."""

    def __init__(self):
        super().__init__()
        self.conv, self.act = nn.Conv2d(3, 4, 3), nn.ReLU(inplace=True)

    def forward(self, x):
        y = self.conv(x)
        before = y.sum(dim=1)  # read before the mutation
        self.act(y)  # relu_
        y.add_(1.0).mul_(before[:, None])
        return y, before


def test_inplace_ops_rebind_the_mutated_tensor():
    torch.manual_seed(0)
    model = InPlace().eval()
    x = torch.randn(2, 3, 8, 8)
    got = from_torch(model, (x,))(x)
    with torch.no_grad():
        ref = model(x)
    for g, r in zip(got, ref):
        _close(g, r)


# ---------------------------------------------------------------------------- transformers
def test_vit_encoder_dynamic_batch():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=64, image_size=16, patch_size=4,
                                    attn_implementation="sdpa")
    model = transformers.ViTModel(config, add_pooling_layer=True).eval()
    prog = from_torch(model, (torch.randn(2, 3, 16, 16),),
                      dynamic_shapes=({0: Dim("batch", max=6)},))
    for b in (2, 3):
        x = torch.randn(b, 3, 16, 16)
        with torch.no_grad():
            ref = model(x)
        got = prog(x)
        _close(got.last_hidden_state, ref.last_hidden_state)
        _close(got.pooler_output, ref.pooler_output)
    assert prog.program.stats["planner_runs"] == 1
    roots = _roots(prog)
    # a norm is a norm kernel, or a generated row kernel fusing it with the residual add
    norms = roots["layer_norm"] + sum(getattr(s.kernel, "generated", False) and "sqrt" in {
        n.op.name for n in s.nodes} for s in prog.plan.steps)
    assert roots["conv2d"] == 1 and norms == 2 * 2 + 1, roots  # patches; norms
    assert roots["scaled_dot_product_attention"] == 2, roots


def test_whisper_encoder_dynamic_batch():
    transformers = pytest.importorskip("transformers")
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    torch.manual_seed(0)
    config = transformers.WhisperConfig(num_mel_bins=8, d_model=32, encoder_layers=2,
                                        encoder_attention_heads=4, encoder_ffn_dim=64,
                                        max_source_positions=16, attn_implementation="sdpa")
    model = WhisperEncoder(config).eval()
    prog = from_torch(model, (torch.randn(2, 8, 32),), dynamic_shapes=({0: Dim("batch", max=4)},))
    for b in (2, 4, 1):
        x = torch.randn(b, 8, 32)
        with torch.no_grad():
            _close(prog(x).last_hidden_state, model(x).last_hidden_state)
    assert prog.program.stats["planner_runs"] == 1
    roots = _roots(prog)
    assert roots["conv2d"] == 2, roots  # the two 1-d convolutions, each one whole conv
    assert roots["scaled_dot_product_attention"] == 2, roots


# ---------------------------------------------------------------------------- plain torch
class SuperResolution(nn.Module):
    """Sub-pixel upsampling with a transposed-convolution branch, instance norm and reflect
    padding."""

    def __init__(self, scale=2):
        super().__init__()
        self.head = nn.Sequential(nn.ReflectionPad2d(2), nn.Conv2d(3, 16, 5),
                                  nn.InstanceNorm2d(16, affine=True), nn.LeakyReLU(0.1))
        self.body = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=4), nn.Hardswish(),
                                  nn.Conv2d(16, 3 * scale * scale, 3, padding=1,
                                            padding_mode="replicate"))
        self.shuffle = nn.PixelShuffle(scale)
        self.up = nn.ConvTranspose2d(16, 3, 4, stride=2, padding=1)
        self.gate = nn.Sequential(nn.AvgPool2d(2), nn.Conv2d(16, 3, 1), nn.Hardsigmoid())

    def forward(self, x):
        h = self.head(x)
        y = self.shuffle(self.body(h)) + self.up(F.gelu(h))
        g = F.interpolate(self.gate(h), scale_factor=4, mode="bilinear", align_corners=False)
        return torch.tanh(y) * g + F.interpolate(x, scale_factor=2, mode="nearest")


def test_super_resolution_cnn_dynamic_batch(randomize_norms):
    torch.manual_seed(0)
    model = randomize_norms(SuperResolution()).eval()
    prog = from_torch(model, (torch.randn(2, 3, 12, 12),),
                      dynamic_shapes=({0: Dim("batch", max=4)},))
    for b in (2, 3):
        x = torch.randn(b, 3, 12, 12)
        with torch.no_grad():
            _close(prog(x), model(x))
    assert prog.program.stats["planner_runs"] == 1
    assert _roots(prog)["group_norm"] == 1  # instance norm: a group norm of one channel each


class TemporalConvNet(nn.Module):
    """Dilated causal 1-d convolutions with gated (GLU) activations, a squeeze-excitation
    gate and a pooled head over a dynamic batch and a dynamic length."""

    def __init__(self, cin=6, hidden=16, classes=5):
        super().__init__()
        self.inp = nn.Conv1d(cin, hidden, 1)
        self.convs = nn.ModuleList(nn.Conv1d(hidden, 2 * hidden, 3, dilation=d)
                                   for d in (1, 2, 4))
        self.norm = nn.LayerNorm(hidden)
        self.se = nn.Sequential(nn.Linear(hidden, 4), nn.Softplus(beta=2.0), nn.Linear(4, hidden),
                                nn.Sigmoid())
        self.head = nn.Sequential(nn.Linear(2 * hidden, 32), nn.Mish(), nn.Dropout(0.2),
                                  nn.Linear(32, classes), nn.ELU(0.5))

    def forward(self, x):
        h = self.inp(x)
        for conv in self.convs:
            d = conv.dilation[0]
            h = h + F.glu(conv(F.pad(h, (2 * d, 0))), dim=1)  # causal: pad on the left only
        h = self.norm(h.transpose(1, 2)).transpose(1, 2)
        h = h * self.se(h.mean(-1)).unsqueeze(-1)
        pooled = torch.cat([h.mean(-1), h.amax(-1)], dim=1)
        return self.head(pooled), F.softplus(h[:, :, -1])


def test_temporal_conv_net_dynamic_batch_and_length():
    torch.manual_seed(0)
    model = TemporalConvNet().eval()
    shapes = ({0: Dim("batch", max=4), 2: Dim("length", min=2, max=64)},)
    prog = from_torch(model, (torch.randn(2, 6, 20),), dynamic_shapes=shapes)
    for b, n in ((2, 20), (3, 7), (1, 64)):
        x = torch.randn(b, 6, n)
        with torch.no_grad():
            ref = model(x)
        got = prog(x)
        for g, r in zip(got, ref):
            _close(g, r)
    assert prog.program.stats["planner_runs"] == 1
