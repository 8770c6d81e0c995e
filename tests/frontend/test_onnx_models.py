"""ONNX exports of real models (GPT-2 2-layer, a MiniLM-shaped BERT; transformers configs
with random weights) imported with tg.from_onnx and compared with ONNX Runtime on the same
file: one plan for symbolic batch and sequence, two call shapes each."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("onnx", reason="the onnx extra is not installed (pip install -e '.[onnx]')")
ort = pytest.importorskip("onnxruntime", reason="the onnx extra is not installed "
                                                "(pip install -e '.[onnx]')")
pytest.importorskip("onnxscript", reason="torch.onnx.export(dynamo=True) needs onnxscript "
                                         "(the onnx extra)")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import tensor_graphs as tg  # noqa: E402
from tensor_graphs.numerics import relative_error  # noqa: E402

TOL = 1e-4  # against ONNX Runtime's float32, by the one error measure


class Logits(torch.nn.Module):
    """The model's tensor output only (what an exported graph returns)."""

    def __init__(self, model, field):
        super().__init__()
        self.model, self.field = model, field

    def forward(self, input_ids, attention_mask):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False) \
            if self.field == "logits" else \
            self.model(input_ids=input_ids, attention_mask=attention_mask)
        return getattr(out, self.field)


def export(model, field, path, dynamo: bool = True):
    """torch.onnx.export, batch and sequence symbolic: the dynamo exporter (opset 18 on), or
    the TorchScript one at opset 14 (Shape -> Gather -> Unsqueeze -> Concat chains, norms
    spelled out; it fails on GPT-2's masks in transformers 5 with aten::diff)."""
    torch.manual_seed(0)
    ids = torch.randint(0, 100, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.int64)
    names = {"input_names": ["input_ids", "attention_mask"], "output_names": ["out"]}
    with torch.no_grad():
        if dynamo:
            batch, seq = torch.export.Dim("batch", max=8), torch.export.Dim("seq", max=32)
            torch.onnx.export(Logits(model, field).eval(), (ids, mask), str(path), dynamo=True,
                              dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}),
                              verbose=False, **names)
        else:
            axes = {0: "batch", 1: "seq"}
            torch.onnx.export(Logits(model, field).eval(), (ids, mask), str(path),
                              dynamo=False, opset_version=14,
                              dynamic_axes={"input_ids": axes, "attention_mask": axes},
                              **names)
    return path


def check(path):
    session = ort.InferenceSession(str(path))
    prog = tg.from_onnx(path, {"batch": 4, "seq": 16})
    planned = prog.program.stats["planner_runs"]
    rng = np.random.default_rng(0)
    for batch, seq in ((2, 7), (3, 12)):
        ids = rng.integers(0, 100, (batch, seq)).astype(np.int64)
        mask = np.ones((batch, seq), np.int64)
        mask[-1, seq - 2:] = 0  # a padded row
        feeds = {"input_ids": ids, "attention_mask": mask}
        ref = session.run(None, feeds)[0]
        got = prog(**feeds)[0]
        assert got.shape == ref.shape
        err = relative_error(got.astype(np.float64), ref.astype(np.float64))
        assert err <= TOL, f"{path.name} at {(batch, seq)}: error {err:.2e}"
    assert prog.program.stats["planner_runs"] == planned  # planned once, for both shapes


@pytest.mark.slow
def test_gpt2_two_layers_matches_onnxruntime(tmp_path):
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100,
                                  n_positions=64)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    check(export(model, "logits", tmp_path / "gpt2.onnx"))


@pytest.mark.slow
@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript-opset14"])
def test_minilm_shaped_bert_matches_onnxruntime(tmp_path, dynamo):
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=128,
                                  max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.BertModel(cfg).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notices
        path = export(model, "last_hidden_state", tmp_path / "bert.onnx", dynamo)
    check(path)
