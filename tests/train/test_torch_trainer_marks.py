"""tg.from_torch(train=True) of modules whose forward says what torch's autograd must not
differentiate, or differentiates its own way: ``.detach()`` (straight-through estimators,
detached norms), ``torch.no_grad()`` blocks and methods, ``set_grad_enabled(False)`` with an
``enable_grad()`` inside, nn.Embedding's ``padding_idx`` (``scale_grad_by_freq`` is refused,
never trained wrong), and a 0-d parameter (CLIP's ``logit_scale``). Each is one SGD step of
learning rate 1 (the parameters move by their gradient) next to torch.autograd on a float64
copy, compared by ||got - ref|| / ||ref||; inference imports stay what they were."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.numerics import relative_error

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional


class _TwoLinear(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 3)
        self.double()


class Detached(_TwoLinear):
    def forward(self, x):
        h = self.a(x)
        return self.b(h / h.norm(dim=-1, keepdim=True).detach())


class StraightThrough(_TwoLinear):
    def forward(self, x):
        h = self.a(x)
        return self.b(h + (torch.round(h * 4) / 4 - h).detach())


class NoGradBlock(_TwoLinear):
    def forward(self, x):
        with torch.no_grad():
            gate = torch.sigmoid(self.a(x))
        return self.b(self.a(x) * gate)


class NoGradMethod(_TwoLinear):
    @torch.no_grad()
    def gate(self, x):
        return torch.sigmoid(self.a(x))

    def forward(self, x):
        return self.b(self.a(x) * self.gate(x))


class GradModes(_TwoLinear):
    """set_grad_enabled(False) around an enable_grad() block, a value passed through as it
    is, and an einsum (torch's decomposition retraces the program: the regions must be
    followed before it, which forgets them)."""

    def forward(self, x):
        h = self.a(x)
        with torch.set_grad_enabled(False):
            doubled = h * 2
            with torch.enable_grad():
                live = self.a(x) * doubled
            after = live + 1
            same = h
        return self.b(doubled + live + after + same + torch.einsum("ij,jk->ik", h, self.a.weight))


def _one_step_gradients(module, args, loss_fn):
    """(ours, torch's) gradient of every parameter: one SGD step of lr 1 from the same
    values, and torch.autograd on a copy."""
    reference = copy.deepcopy(module)
    trainer = tg.from_torch(module, args, train=True, loss_fn=loss_fn,
                            optimizer=tg.optim.SGD(1.0))
    before = {n: p.detach().numpy().copy() for n, p in module.named_parameters()}
    trainer.step(*args)
    after = trainer.weights()
    loss_fn(reference(*args[:-1]), args[-1]).backward()
    return ({n: before[n] - after[n] for n in before},
            {n: p.grad.numpy() for n, p in reference.named_parameters()})


@pytest.mark.parametrize("cls", [Detached, StraightThrough, NoGradBlock, NoGradMethod,
                                 GradModes], ids=lambda c: c.__name__)
def test_detach_and_no_grad_stop_the_gradient_as_in_torch(cls):
    x = torch.randn(8, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([0, 2, 1, 1, 0, 2, 2, 1])
    ours, theirs = _one_step_gradients(cls(), (x, y), F.cross_entropy)
    for name, ref in theirs.items():
        assert relative_error(ours[name], ref) <= 1e-12, name


def test_inference_imports_are_unchanged():
    """Exported for inference, detach and an embedding's padding_idx import as before: the
    graph is the one of the same module without them (hash-consed: the same node), so its
    digests, plan caches and lock files are too."""
    x = torch.randn(8, 4, dtype=torch.float64)

    class Plain(_TwoLinear):
        def forward(self, x):
            h = self.a(x)
            return self.b(h / h.norm(dim=-1, keepdim=True))

    def graph(module, args):
        with torch.no_grad():
            exported = torch.export.export(module.eval(), args)
        return tg.frontend.import_exported(exported)[0][0]

    assert graph(Detached(), (x,)) is graph(Plain(), (x,))
    ids = torch.tensor([[0, 3, 0, 5]])
    assert graph(_Embedded(padding_idx=0, scale_grad_by_freq=True), (ids,)) \
        is graph(_Embedded(), (ids,))
    prog = tg.from_torch(Detached(), (x,))
    assert relative_error(prog(x), Detached()(x).detach().numpy()) <= 1e-12


class _Embedded(nn.Module):
    def __init__(self, **options):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.out = nn.Embedding(10, 4, **options), nn.Linear(4, 3)
        self.double()

    def forward(self, ids):
        return self.out(self.emb(ids)).mean(1)


@pytest.mark.parametrize("padding_idx", [0, -1], ids=["first", "last"])
def test_embedding_padding_row_trains_as_in_torch(padding_idx):
    """The padding row gets no gradient (so it stays as it is); the others get torch's."""
    ids = torch.tensor([[0, 1, 2, 0, 9], [3, 0, 1, 1, 9]])
    y = torch.tensor([0, 2])
    ours, theirs = _one_step_gradients(_Embedded(padding_idx=padding_idx), (ids, y),
                                       F.cross_entropy)
    for name, ref in theirs.items():
        assert relative_error(ours[name], ref) <= 1e-12, name
    assert not ours["emb.weight"][padding_idx].any()


def test_embedding_scale_grad_by_freq_is_refused_for_training():
    """Dividing each lookup's gradient by its id's count is not mapped: refused, naming the
    option, rather than trained with torch's unscaled gradient."""
    ids, y = torch.tensor([[0, 1, 1, 2]]), torch.tensor([1])
    with pytest.raises(tg.ArgumentError, match=r"embedding\(scale_grad_by_freq=True\) in "
                                               r"training.*scale_grad_by_freq=False"):
        tg.from_torch(_Embedded(scale_grad_by_freq=True), (ids, y), train=True,
                      loss_fn=F.cross_entropy, optimizer=tg.optim.SGD(0.1))


def test_embedding_bag_scale_grad_by_freq_is_refused_for_training():
    bag = nn.EmbeddingBag(10, 4, mode="sum", scale_grad_by_freq=True).double()

    class Bags(nn.Module):
        def __init__(self):
            super().__init__()
            self.bag = bag

        def forward(self, ids, offsets):
            return self.bag(ids, offsets)

    ids, offsets = torch.tensor([0, 1, 1, 2, 1, 0, 3]), torch.tensor([0, 3, 5])
    target = torch.zeros(3, 4, dtype=torch.float64)
    with pytest.raises(tg.ArgumentError, match=r"embedding_bag\(scale_grad_by_freq=True\) in "
                                               r"training.*scale_grad_by_freq=False"):
        tg.from_torch(Bags(), (ids, offsets, target), train=True, loss_fn=F.mse_loss,
                      optimizer=tg.optim.SGD(0.1))
    prog = tg.from_torch(Bags(), (ids, offsets))  # inference: only the bags' values matter
    np.testing.assert_allclose(prog(ids, offsets), bag(ids, offsets).detach().numpy())


class _Scaled(nn.Module):
    """CLIP's learnable temperature: a 0-d parameter."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(3, 2)
        self.logit_scale = nn.Parameter(torch.tensor(1.5))
        self.double()

    def forward(self, x):
        return self.lin(x) * self.logit_scale.exp()


def test_a_0d_parameter_trains_as_torch_trains_it():
    module = _Scaled()
    reference = copy.deepcopy(module)
    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.standard_normal((8, 3)))
    y = torch.from_numpy(rng.integers(0, 2, 8))
    trainer = tg.from_torch(module, (x, y), train=True, loss_fn=F.cross_entropy,
                            optimizer=tg.optim.Adam(0.05))
    topt = torch.optim.Adam(reference.parameters(), lr=0.05)
    for step in range(5):
        ours = trainer.step(x, y)
        topt.zero_grad()
        theirs = F.cross_entropy(reference(x), y)
        theirs.backward()
        topt.step()
        assert abs(ours - theirs.item()) <= 1e-12 * abs(theirs.item()), step
    assert trainer.weights()["logit_scale"].shape == ()
    trainer.load_into(module)
    for name, p in reference.named_parameters():
        got = dict(module.named_parameters())[name].detach()
        assert got.shape == p.shape and relative_error(got.numpy(), p.detach().numpy()) <= 1e-12
