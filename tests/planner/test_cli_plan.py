"""tg profile, tg paths and tg explain on a saved graph, into a temporary database."""

import pytest

import tensor_graphs as tg
from tensor_graphs.cli import main
from tensor_graphs.db.store import Database


@pytest.fixture
def graph_file(tmp_path):
    x = tg.input("x", ("n", 16))
    w = tg.weight("w", (16, 8))
    path = tmp_path / "g.json"
    tg.save(tg.tanh(x @ w), path)
    return str(path)


def test_profile_fills_the_database_then_resumes(graph_file, tmp_path, capsys):
    db = str(tmp_path / "m.sqlite")
    assert main(["profile", graph_file, "--dim", "n=4", "--db", db, "--paths", "2",
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "default" in out and "best estimate" in out and "measured" in out
    with Database(db) as d:
        rows = d.stats()["rows"]
        assert rows > 3
        assert d.calibration() is not None
    assert main(["profile", graph_file, "--dim", "n=4", "--db", db, "--paths", "1",
                 "--quiet"]) == 0
    again = capsys.readouterr().out
    assert "measured 0 kernel calls" in again  # resumed: everything already there
    with Database(db) as d:
        assert d.stats()["rows"] == rows


def test_explain_and_paths(graph_file, tmp_path, capsys):
    db = str(tmp_path / "m.sqlite")
    assert main(["explain", graph_file, "--dim", "n=4", "--db", db]) == 0
    out = capsys.readouterr().out
    # tanh(x @ w) is one generated GEMM whose epilogue is tanh's decomposition
    assert "matmul" in out and ("tanh" in out or "generated" in out) and "predicted" in out
    assert main(["paths", graph_file, "--dim", "n=4", "--db", db, "--limit", "3"]) == 0
    out = capsys.readouterr().out
    assert "paths; the 3 cheapest-first" in out and len(out.strip().splitlines()) == 4


def test_missing_dims_and_unknown_graphs_are_explained(graph_file, capsys):
    assert main(["explain", graph_file, "--db", ":memory:"]) == 2
    assert "--dim n=..." in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:  # the parser refuses it, before anything loads
        main(["explain", "no-such-graph", "--db", ":memory:"])
    assert stop.value.code == 2 and "neither a graph file" in capsys.readouterr().err


def test_help_explains_each_command(capsys):
    for command in ("profile", "paths", "explain"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert "graph" in capsys.readouterr().out
