"""tg.from_torch: torch.export'ed modules compiled and compared with torch on the same weights."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402,N812

import tensor_graphs as tg  # noqa: E402
from tensor_graphs.frontend import TorchProgram, UnsupportedOpError, from_torch  # noqa: E402
from tensor_graphs.numerics import relative_error  # noqa: E402

TOL = 1e-4


def _check(prog: TorchProgram, module, *args):
    got = prog(*args)
    with torch.no_grad():
        ref = module(*(torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in args))
    if isinstance(ref, torch.Tensor):
        ref, got = (ref,), (got,)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert isinstance(g, np.ndarray)
        assert g.shape == tuple(r.shape)
        assert relative_error(g, r.numpy()) <= TOL
    return got


class MLP(nn.Module):
    def __init__(self, d=16, h=64):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, h), nn.Linear(h, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """A pre-norm transformer block in plain torch."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.reshape(b, t, self.heads, -1).permute(0, 2, 1, 3)
        v = v.view(b, t, self.heads, -1).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(a.transpose(1, 2).contiguous().view(b, t, d)))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Embedder(nn.Module):
    def __init__(self, vocab=50, d=24):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.register_buffer("pos", torch.randn(16, d))
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        h = self.emb(ids) + self.pos[: ids.shape[1]]
        return torch.log_softmax(self.head(torch.tanh(h)), dim=-1), h.mean(dim=1)


def test_mlp():
    torch.manual_seed(0)
    m = MLP().eval()
    x = torch.randn(4, 16)
    prog = from_torch(m, (x,))
    _check(prog, m, x)
    _check(prog, m, x.numpy())  # numpy in works too
    assert {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"} <= {
        n.name for n in tg.nodes(prog.program._outputs) if n.op.name == "weight"}


def test_transformer_block_uses_fused_kernels():
    torch.manual_seed(0)
    m = Block().eval()
    x = torch.randn(2, 8, 32)
    prog = from_torch(m, (x,))
    _check(prog, m, x)
    kernels = prog.program.plan.kernels
    assert any("layer_norm" in k for k in kernels), kernels
    assert any("attention" in k for k in kernels), kernels
    assert "attention" in prog.explain()


def test_embedding_model_and_tuple_output():
    torch.manual_seed(0)
    m = Embedder().eval()
    ids = torch.randint(0, 50, (3, 7))
    prog = from_torch(m, (ids,))
    out = _check(prog, m, ids)
    assert isinstance(out, tuple) and len(out) == 2


def test_dynamic_batch_and_seq():
    torch.manual_seed(0)
    m = Block().eval()
    batch, seq = torch.export.Dim("batch", max=8), torch.export.Dim("seq", max=32)
    prog = from_torch(m, (torch.randn(2, 8, 32),), dynamic_shapes=({0: batch, 1: seq},))
    x = next(n for n in tg.nodes(prog.program._outputs) if n.op.name == "input")
    assert tuple(map(str, x.shape)) == ("batch", "seq", "32")
    for b, t in ((2, 8), (3, 5), (1, 32)):
        _check(prog, m, torch.randn(b, t, 32))
    assert prog.program.stats["planner_runs"] == 1


class Ops(nn.Module):
    """Many mapped ops at once, each compared through the output."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, 6))
        self.ln = nn.LayerNorm((3, 6))

    def forward(self, x, y):
        a = torch.relu(x) - torch.sigmoid(y) * 2.0 + torch.exp(-x.abs()) / (y * y + 1.0)
        b = torch.matmul(a, self.w) + torch.mm(a[0], self.w.t())
        c = torch.bmm(b, b.transpose(1, 2)).softmax(-1)
        d = torch.addmm(self.w[0], a[1], self.w)
        e = torch.cat([x.unsqueeze(0), y.unsqueeze(0)], dim=0).sum(dim=(0, 2), keepdim=True)
        f = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * x
        g = F.silu(x).expand(2, 3, 3, 6).permute(1, 0, 2, 3).reshape(3, -1).squeeze()
        h = self.ln(x) + x[:, 1:2].select(-1, 3).unsqueeze(-1) - 1 - x.clone().contiguous()
        i = F.gelu(y) * torch.tanh(y) + torch.sqrt(y * y + 0.5) - x.neg() / 3
        return c, d, e, f, g.t(), h, i, F.log_softmax(x, dim=0)


def test_many_ops():
    torch.manual_seed(0)
    m = Ops().eval()
    x, y = torch.randn(3, 3, 6), torch.randn(3, 3, 6)
    _check(from_torch(m, (x, y)), m, x, y)


def test_bad_arguments_name_the_argument():
    m = MLP().eval()
    prog = from_torch(m, (torch.randn(4, 16),))
    with pytest.raises(tg.TensorGraphsError, match="expected 1 argument"):
        prog(torch.randn(4, 16), torch.randn(4, 16))
    with pytest.raises(tg.ShapeError, match="'x'"):
        prog(torch.randn(4, 15))
    with pytest.raises(tg.DTypeError, match="'x'"):
        prog(np.zeros((4, 16)))


class Unsupported(nn.Module):
    def forward(self, x):
        y = torch.special.bessel_j0(x)
        z = torch.fft.fft(x).real
        return torch.relu(y + z) + torch.special.bessel_j0(z * 2)


def test_unsupported_ops_listed_in_one_error():
    with pytest.raises(UnsupportedOpError) as info:
        from_torch(Unsupported(), (torch.randn(4, 4),))
    assert isinstance(info.value, tg.TensorGraphsError)
    message = str(info.value)
    assert "bessel_j0" in message and "fft" in message
    assert "bessel_j0(x)" in message and "bessel_j0(z * 2)" in message  # each use
    assert "test_torch_export.py" in message  # the source line of the op
    ops = {op for op, _ in info.value.ops}
    assert any("bessel_j0" in op for op in ops) and any("fft" in op for op in ops)
    assert len(info.value.ops) >= 3


class Indexing(nn.Module):
    """Creation and indexing as transformers spells its masks: aranges over the symbolic
    length, advanced indexing with broadcast index tensors, gather, diff, bool logic."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.arange(64).reshape(2, 32) % 7)

    def forward(self, x, ids):
        n = x.shape[1]
        pos = torch.arange(n) + 2
        keep = pos[None, :, None] <= pos[None, None, :]  # (1, n, n) bool
        both = x.new_ones((), dtype=torch.bool) & keep | torch.zeros(1, n, n, dtype=torch.bool)
        rows = torch.arange(x.shape[0])[:, None]
        picked = x[rows, ids]  # (b, n, d): broadcast index tensors on adjacent axes
        middle = x[:, ids[0]]  # a whole leading axis, then an index
        sel = x[..., torch.tensor([3, 0, -1])]  # a negative index counts from the end
        g = torch.gather(x, 1, ids[:, :, None].expand(-1, -1, x.shape[2]))
        types = torch.gather(self.table[:, :n].expand(x.shape[0], -1, -1)[:, 0], 1, ids)
        d = torch.diff(x, dim=1, prepend=x[:, :1] * 0.5)
        full = torch.full((1, n), 0.25) + torch.ones(1, n) + torch.zeros_like(x[..., 0])
        masked = torch.where(both, x @ x.transpose(1, 2), torch.full_like(keep, -1.0,
                                                                          dtype=x.dtype))
        return masked, picked, middle, sel, g, types.float(), d, full, x.to(x.device) * 2


def test_creation_and_indexing_over_a_dynamic_length():
    torch.manual_seed(0)
    m = Indexing().eval()
    seq = torch.export.Dim("seq", max=20)
    x, ids = torch.randn(2, 9, 5), torch.randint(0, 9, (2, 9))
    prog = from_torch(m, (x, ids), dynamic_shapes=({1: seq}, {1: seq}))
    for n in (9, 4, 20):
        x, ids = torch.randn(2, n, 5), torch.randint(0, n, (2, n))
        _check(prog, m, x, ids)
    assert prog.program.stats["planner_runs"] == 1


class Upsample(nn.Module):
    def forward(self, x):
        return (F.interpolate(x, scale_factor=2.0, mode="nearest"),
                F.interpolate(x, size=(5, 7), mode="bilinear", align_corners=False),
                F.interpolate(x, size=(6, 9), mode="nearest-exact"))


def test_upsampling():
    x = torch.randn(1, 3, 4, 6)
    _check(from_torch(Upsample(), (x,)), Upsample(), x)


def test_integer_bit_operations():
    class Bits(nn.Module):
        def forward(self, x):
            return x & (x + 1)

    x = torch.arange(6)
    np.testing.assert_array_equal(from_torch(Bits(), (x,))(x.numpy()), (x & (x + 1)).numpy())


# ---------------------------------------------------------------------------- layer mappings
class NormsAndPools(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn2, self.bn1 = nn.BatchNorm2d(4), nn.BatchNorm1d(4)
        self.inorm = nn.InstanceNorm2d(4, affine=True)
        self.max = nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True)
        self.avg = nn.AvgPool2d((2, 3), stride=(2, 1), padding=(1, 1), count_include_pad=False)
        self.adaptive = nn.AdaptiveAvgPool2d((3, 2))

    def forward(self, x, s):
        batch_stats = F.batch_norm(x, None, None, training=True, eps=1e-3)
        return (self.bn2(x), self.inorm(x), self.max(x), self.avg(x), self.adaptive(x),
                batch_stats, F.max_pool2d(x, 2, dilation=2), self.bn1(s),
                F.max_pool1d(s, 3, stride=2, padding=1), F.avg_pool1d(s, 4, stride=2),
                F.adaptive_avg_pool1d(s, 3), F.adaptive_avg_pool2d(x, 1))


def test_norms_and_pooling(randomize_norms):
    torch.manual_seed(0)
    m = randomize_norms(NormsAndPools()).eval()
    x, s = torch.randn(2, 4, 9, 10), torch.randn(3, 4, 11)
    prog = from_torch(m, (x, s))
    _check(prog, m, x, s)
    kernels = " ".join(prog.program.plan.kernels)
    assert "batch_norm" in kernels and "max_pool2d" in kernels, kernels


class Convs(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(4, 6, 3, padding="same", dilation=2)
        self.c1s = nn.Conv1d(4, 4, 5, stride=2, groups=2, bias=False)
        self.c2 = nn.Conv2d(4, 6, (2, 4), padding="same")  # even kernels: asymmetric 'same'
        self.c2v = nn.Conv2d(4, 2, 3, padding="valid")
        self.t2 = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.t2d = nn.ConvTranspose2d(4, 3, (2, 3), stride=(1, 2), dilation=(2, 1))
        self.t1 = nn.ConvTranspose1d(4, 2, 4, stride=3, padding=2)

    def forward(self, x, s):
        return (self.c1(s), self.c1s(s), self.c2(x), self.c2v(x[0]), self.t2(x), self.t2d(x),
                self.t1(s))


@pytest.mark.filterwarnings("ignore:Using padding='same'")
def test_convolutions():
    torch.manual_seed(0)
    m = Convs().eval()
    x, s = torch.randn(2, 4, 7, 8), torch.randn(2, 4, 12)
    prog = from_torch(m, (x, s))
    _check(prog, m, x, s)
    assert any("conv2d" in k for k in prog.program.plan.kernels)


class Activations(nn.Module):
    def __init__(self):
        super().__init__()
        self.prelu = nn.PReLU(4, init=0.2)
        self.prelu.weight.data.uniform_(-0.5, 0.5)
        self.rrelu = nn.RReLU(0.1, 0.3)

    def forward(self, x):
        y = x * 3
        return (F.hardtanh(y, -2.0, 1.5), F.relu6(y), F.leaky_relu(y, 0.2), F.hardswish(y),
                F.hardsigmoid(y), F.elu(y, alpha=0.7), F.celu(y, alpha=1.3), F.selu(y),
                F.softplus(y, beta=2.0, threshold=3.0), F.mish(y), F.logsigmoid(y),
                self.prelu(y), F.glu(y, dim=1), F.threshold(y, 0.5, -1.0),
                F.softshrink(y, 0.7), F.hardshrink(y, 0.4), self.rrelu(y), torch.sign(y),
                torch.addcmul(x, y, x, value=0.5), torch.lerp(x, y, 0.3))


def test_activations():
    torch.manual_seed(0)
    m = Activations().eval()
    x = torch.randn(2, 4, 5)
    _check(from_torch(m, (x,)), m, x)


class Reductions(nn.Module):
    def forward(self, x):
        values, idx = x.max(dim=1)
        low, low_idx = torch.min(x, -1, keepdim=True)
        return (values, idx, low, low_idx, x.argmax(-1), x.argmin(), x.max(), x.min(),
                x.std(dim=-1), x.var(dim=(0, 2), unbiased=False), F.normalize(x, dim=-1),
                torch.linalg.vector_norm(x, ord=1, dim=1), torch.linalg.vector_norm(x, 3.0),
                torch.logsumexp(x, dim=1), x.prod(dim=-1), torch.maximum(x, x.flip(0)))


def test_reductions():
    torch.manual_seed(0)
    m = Reductions().eval()
    x = torch.randn(3, 4, 5)
    _check(from_torch(m, (x,)), m, x)


class Shapes(nn.Module):
    def forward(self, x):
        return (torch.stack([x, x * 2], dim=1), x.flip(-1, 1), x.roll(2, -1),
                x.roll((1, -1), (1, 2)), x.roll(3), x.repeat(2, 1, 1, 3),
                F.pixel_shuffle(x, 2), F.pixel_unshuffle(x, 2), x.narrow(2, 1, 3),
                x.movedim(1, -1), F.pad(x, (1, 2, 0, 1), value=0.5),
                F.pad(x, (2, 1, 1, 3), mode="reflect"), F.pad(x, (3, 0, 2, 1), mode="replicate"),
                F.pad(x, (1, 2, 2, 1), mode="circular"), F.pad(x[0], (1, 2), mode="reflect"))


def test_shapes_and_padding():
    torch.manual_seed(0)
    m = Shapes().eval()
    x = torch.randn(2, 8, 4, 6)
    _check(from_torch(m, (x,)), m, x)


def test_conv1d_over_a_dynamic_length():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv1d(4, 6, 3, padding=2, dilation=2, groups=2), nn.GELU(),
                      nn.Conv1d(6, 3, 1, bias=False)).eval()
    length = torch.export.Dim("length", min=2, max=40)
    prog = from_torch(m, (torch.randn(2, 4, 10),), dynamic_shapes=({2: length},))
    for n in (10, 3, 40):
        _check(prog, m, torch.randn(2, 4, n))
    # one plan serves every length ("planner_runs" also counts a plan made again without a
    # generated kernel whose checked error, measured on fresh random inputs, came out above
    # the tolerance)
    assert prog.program.stats["plans"] == 1
    # strided: the output length floor((L - 3) / 2) + 1 is a size expression of the length
    strided = nn.Conv1d(4, 4, 3, stride=2).eval()
    prog = from_torch(strided, (torch.randn(2, 4, 10),),
                      dynamic_shapes=({2: torch.export.Dim("length", min=5, max=40)},))
    for n in (10, 5, 17, 40):
        _check(prog, strided, torch.randn(2, 4, n))


def test_pooling_indices_import_and_symbolic_spatial_dims_are_named():
    class WithIndices(nn.Module):  # the indices used in arithmetic (issue 21: they import)
        def forward(self, x):
            y, idx = F.max_pool2d(x, 2, return_indices=True)
            return y * idx.float()

    x = torch.randn(1, 2, 4, 4)
    _check(from_torch(WithIndices(), (x,)), WithIndices(), x)

    class ReturnsIndices(nn.Module):
        def forward(self, x):
            return F.max_pool2d(x, 2, return_indices=True)

    got = from_torch(ReturnsIndices(), (x,))(x)
    assert np.array_equal(got[1], F.max_pool2d(x, 2, return_indices=True)[1].numpy())

    class ValuesOnly(nn.Module):  # the unused indices output is fine
        def forward(self, x):
            return F.max_pool2d(x, 2, return_indices=True)[0]

    x = torch.randn(1, 2, 4, 4)
    _check(from_torch(ValuesOnly(), (x,)), ValuesOnly(), x)

    conv = nn.Conv2d(2, 3, 3)  # window positions need concrete spatial dims
    width = torch.export.Dim("width", min=4, max=16)
    with pytest.raises(tg.ShapeError, match="conv2d.*spatial dims.*concrete") as info:
        from_torch(conv, (torch.randn(1, 2, 8, 8),), dynamic_shapes=({3: width},))
    assert "while importing" in "".join(getattr(info.value, "__notes__", []))


def test_dynamic_dim_above_its_bound_and_integer_input_dtype_are_named():
    class Lookup(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)

        def forward(self, ids):
            return self.emb(ids).sum(1)

    torch.manual_seed(0)
    m = Lookup().eval()
    seq = torch.export.Dim("seq", max=8)
    prog = from_torch(m, (torch.randint(0, 10, (2, 5)),), dynamic_shapes=({1: seq},))
    _check(prog, m, torch.randint(0, 10, (2, 8)))  # at the bound
    with pytest.raises(tg.ShapeError, match=r"seq=9 \(bound 8\)"):
        prog(torch.randint(0, 10, (2, 9)))
    with pytest.raises(tg.DTypeError, match="'ids'.*float32.*int64"):
        prog(torch.randn(2, 5))
    with pytest.raises(tg.DTypeError, match="'ids'.*float64.*int64"):
        prog(np.zeros((2, 5)))


@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")
def test_core_aten_graph_after_decompositions(randomize_norms):
    """run_decompositions() spells layers as core ATen (convolution, the native norms with
    their statistics outputs, max_pool2d_with_indices): they import as the same composites."""
    from tensor_graphs.frontend.torch_export import import_exported

    torch.manual_seed(0)
    m = randomize_norms(nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2), nn.GroupNorm(2, 4),
        nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.LayerNorm(16), nn.Hardswish())).eval()
    x = torch.randn(2, 3, 10, 10)
    exported = torch.export.export(m, (x,)).run_decompositions()
    targets = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert {"aten.convolution.default", "aten.max_pool2d_with_indices.default",
            "aten.native_group_norm.default", "aten.native_layer_norm.default"} <= targets
    (out,), (leaf,), weights, _ = import_exported(exported)
    ops = {n.op.name for n in tg.nodes(out)}
    assert {"conv2d", "batch_norm", "max_pool2d", "group_norm", "layer_norm"} <= ops
    names = {n.name for n in tg.nodes(out)}
    got = tg.evaluate(out, {**{k: v for k, v in weights.items() if k in names},
                            leaf.name: x.numpy()})
    with torch.no_grad():
        assert relative_error(got, m(x).numpy()) <= TOL
