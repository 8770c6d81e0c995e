"""`tg explain`, `tg paths` and `tg profile` take an ONNX model file (imported as tg.from_onnx
imports it, its symbolic dims bound with --dim), and a call of a tg.from_onnx program above
the dynamic_dims it was imported with says to import again with larger dynamic_dims=.

Before, every command read a .onnx file as a tg.save graph and refused it as "not UTF-8 text",
and the call's error said "compile again with larger bounds=", a parameter from_onnx lacks.
"""

from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest

pytest.importorskip("onnx", reason="the onnx extra is not installed (pip install -e '.[onnx]')")
pytest.importorskip("onnxscript", reason="torch.onnx.export(dynamo=True) needs onnxscript "
                                         "(the onnx extra)")
torch = pytest.importorskip("torch")

import tensor_graphs as tg  # noqa: E402
from tensor_graphs.cli import main  # noqa: E402
from tensor_graphs.commands.profile import graph_text, load_graph  # noqa: E402
from tensor_graphs.errors import ShapeError  # noqa: E402
from tensor_graphs.ir.serialize import from_json  # noqa: E402


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)

    def forward(self, x):
        return torch.softmax(self.b(torch.relu(self.a(x))), -1)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A small MLP exported with torch.onnx.export (the dynamo exporter: weights in an
    external .data file beside it), its batch dim symbolic and named "rows"."""
    folder = tmp_path_factory.mktemp("onnx_cli")
    path = folder / "mlp.onnx"
    torch.manual_seed(0)
    m = MLP().eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (torch.randn(3, 16),), str(path), dynamo=True,
                          input_names=["x"], output_names=["y"],
                          dynamic_shapes=({0: torch.export.Dim("rows", max=64)},))
    return {"path": str(path), "torch": m, "folder": folder}


def test_explain_plans_an_onnx_model(model, capsys):
    assert main(["explain", model["path"], "--dim", "rows=5", "--db", ":memory:"]) == 0
    out = capsys.readouterr().out
    assert "matmul" in out and "(rows, 4)" in out and "predicted" in out
    assert main(["explain", model["path"], "--dim", "rows=5", "--db", ":memory:",
                 "-o", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and any("matmul" in r["kernel"] for r in rows)


def test_paths_of_an_onnx_model(model, capsys):
    assert main(["paths", model["path"], "--dim", "rows=5", "--db", ":memory:", "--limit", "4",
                 "-o", "json"]) == 0
    captured = capsys.readouterr()
    costs = [r["cost_s"] for r in json.loads(captured.out)]
    assert len(costs) == 4 and costs == sorted(costs) and "paths; the 4" in captured.err


def test_profile_runs_an_onnx_model(model, tmp_path, capsys):
    db = str(tmp_path / "m.sqlite")
    assert main(["profile", model["path"], "--dim", "rows=2", "--db", db, "--paths", "1",
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "default" in out and "best path found" in out


def test_the_model_dims_are_named_and_asked_for(model, capsys):
    assert main(["explain", model["path"], "--db", ":memory:"]) == 2
    assert "the graph has symbolic dims ['rows']: give --dim rows=..." in capsys.readouterr().err


def test_an_onnx_model_named_otherwise_is_recognised(model, capsys):
    """A protobuf model file without the .onnx name (its weights beside it, as exported)."""
    renamed = model["folder"] / "mlp.model"
    shutil.copyfile(model["path"], renamed)
    assert main(["explain", str(renamed), "--dim", "rows=3", "--db", ":memory:"]) == 0
    assert "matmul" in capsys.readouterr().out


def test_a_file_that_is_no_model_is_refused_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08" + bytes(range(256)) * 4)
    assert main(["paths", str(bad), "--db", ":memory:"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tg paths: error: ") and "bad.onnx" in err and err.count("\n") == 1
    garbage = tmp_path / "garbage.bin"  # a binary file that is neither: the graph file error
    garbage.write_bytes(b"\x08garbage\xff")
    assert main(["explain", str(garbage), "--db", ":memory:"]) == 1
    assert "is not a tensor_graphs graph file" in capsys.readouterr().err


def test_an_onnx_graph_travels_to_ray_nodes_as_graph_json(model):
    """tg profile --ray hands the nodes the graph's JSON (they may not have the file): for an
    ONNX model, its imported graph as tg.save writes it."""
    graph = load_graph(model["path"])
    rebuilt = from_json(json.loads(graph_text(model["path"], graph)))
    assert [str(o.shape) for o in rebuilt] == [str(o.shape) for o in graph]


def test_a_call_above_dynamic_dims_names_dynamic_dims(model):
    prog = tg.from_onnx(model["path"], {"rows": 4}, db=":memory:")
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    (got,) = prog(x=x)
    with torch.no_grad():
        want = model["torch"](torch.from_numpy(x)).numpy()
    assert np.allclose(got, want, atol=1e-5)
    with pytest.raises(ShapeError) as caught:
        prog(x=np.zeros((6, 16), np.float32))
    message = str(caught.value)
    assert "rows=6 (dynamic_dims gave 4)" in message
    assert "import it again with larger dynamic_dims=" in message
    assert "dynamic_dims={'rows': 6}" in message and "bounds=" not in message
