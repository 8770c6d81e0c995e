"""tg db plot: a PNG of a kernel's measured rows and the cost model's curve, and its errors."""

import builtins
import struct

import pytest

import tensor_graphs as tg
from tensor_graphs.cli import main
from tensor_graphs.db.store import open_db

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """A database holding numpy_tanh measured at three sizes (a small profile)."""
    path = str(tmp_path_factory.mktemp("db") / "m.sqlite")
    for n in (64, 512, 4096):
        x = tg.input("x", (n,))
        tg.compile(tg.tanh(x), db=path, backends=("numpy",), profile="missing")
    rows = open_db(path).rows(kernel="numpy_tanh")
    assert len(rows) >= 3
    return path


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.mark.parametrize("feature", ["work", "bytes"])
def test_plot_writes_a_png_of_the_rows_and_the_curve(profiled, tmp_path, capsys, feature):
    pytest.importorskip("matplotlib", reason="the dev extra installs it (tg db plot draws)")
    out = tmp_path / "tanh.png"
    assert main(["db", "plot", "numpy_tanh", "-o", str(out), "--db", profiled,
                 "--x", feature]) == 0
    said = capsys.readouterr().out
    assert "3 measured points, 1 curve(s)" in said
    width, height = png_size(out)
    assert (width, height) == (800, 550)
    assert out.stat().st_size > 10_000  # points, curves, legend: not an empty canvas


def test_plot_curve_is_the_models_interpolation(profiled, tmp_path):
    pytest.importorskip("matplotlib", reason="the dev extra installs it (tg db plot draws)")
    from tensor_graphs.commands.db_plot import plot_kernel

    drawn = plot_kernel(open_db(profiled), "numpy_tanh", str(tmp_path / "p.png"))
    assert drawn == {"points": 3, "classes": 1, "curve_points": 64}


def test_plot_of_a_kernel_without_rows_says_how_to_measure(profiled, tmp_path, capsys):
    out = tmp_path / "none.png"
    assert main(["db", "plot", "numpy_softmax", "-o", str(out), "--db", profiled]) == 1
    err = capsys.readouterr().err
    assert "no measured rows of numpy_softmax" in err and "tg profile" in err
    assert not out.exists()


def test_plot_of_an_unknown_kernel(profiled, tmp_path, capsys):
    assert main(["db", "plot", "no_such_kernel", "-o", str(tmp_path / "x.png"),
                 "--db", profiled]) == 1
    assert "no kernel named 'no_such_kernel'" in capsys.readouterr().err


def test_plot_without_matplotlib_names_the_extra(profiled, tmp_path, capsys, monkeypatch):
    real = builtins.__import__

    def no_matplotlib(name, *args, **kw):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib'")
        return real(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    out = tmp_path / "x.png"
    assert main(["db", "plot", "numpy_tanh", "-o", str(out), "--db", profiled]) == 1
    assert 'pip install "tensor_graphs[plot]"' in capsys.readouterr().err
    assert not out.exists()


def test_plot_needs_an_output_file(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["db", "plot", "numpy_tanh"])
    assert exc.value.code == 2
    assert "-o" in capsys.readouterr().err
