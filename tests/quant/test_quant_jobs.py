"""``tg run ... --quantize SCHEME``: the jobs run the quantized model and report its accuracy
against float32 (the same weights unquantized) beside it."""

import re

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tensor_graphs.cli import main  # noqa: E402

pytestmark = pytest.mark.usefixtures("hub_offline")  # (tests/conftest.py)


def _pairs(out: str) -> list[tuple[float, float, float]]:
    """(scheme, float32, difference) of each pair in the accuracy table."""
    table = out.split("against float32 (the same weights, unquantized):")[1]
    return [tuple(map(float, m)) for m in
            re.findall(r"\[\d+\] \[\d+\]\s+(-?[\d.]+)\s+(-?[\d.]+)\s+([+-][\d.]+)", table)]


def _minilm(shared, *options: str) -> list[str]:
    """``tg run minilm`` on the 16 real sentences of the session's MiniLM programs
    (``minilm_int8_dynamic``, tests/conftest.py), int8-dynamic, with ``--db`` their database:
    the job plans the same graphs at the same bounds from the same (empty) database, so its
    two compiles replay those plans from the plan cache rather than search for a minute."""
    return ["run", "minilm", *shared.sentences, "--quantize", "int8-dynamic", "--profile",
            "never", "--db", shared.db, "--repeats", "1", *options]


@pytest.mark.slow
def test_run_minilm_int8_dynamic_reports_accuracy_against_float32(capsys,
                                                                  minilm_int8_dynamic):
    code = main(_minilm(minilm_int8_dynamic))
    captured = capsys.readouterr()
    out = captured.out
    assert code == 0, out + captured.err
    assert "tokens, int8-dynamic):" in out  # the table is the quantized model's
    pairs = _pairs(out)
    n = len(minilm_int8_dynamic.sentences)
    assert len(pairs) == n * (n - 1) // 2
    for q, f, d in pairs:
        assert abs(q - f - d) < 2e-4 and abs(d) <= 0.01
    worst = float(re.search(r"max \|difference\| ([\d.]+) \(within 0.01\)", out).group(1))
    assert worst == pytest.approx(max(abs(d) for *_, d in pairs), abs=2e-4)
    # int8 GEMMs in groups of 32 (tg.quantize's GROUP_SIZE): every MiniLM K (384, 1536)
    # divides by 32, so an ungrouped c_q8d_ kernel means the groups were dropped
    fused = out.split("fused or whole:")[1]
    assert re.search(r"c_q8d_g32_matmul\w* x\d+", fused), fused
    assert not re.search(r"c_q8d_(?!g32_)", fused), fused
    assert "float32:" in out and "x); torch eager" in out  # both timed
    # the float program still matches torch: its check is unchanged
    assert "agreement of the float32 program" in out and "(within 0.0001)" in out


@pytest.mark.slow
def test_run_minilm_quantized_exits_1_above_the_tolerance(capsys, minilm_int8_dynamic):
    code = main(_minilm(minilm_int8_dynamic, "--quant-tolerance", "0"))
    out = capsys.readouterr().out
    assert code == 1 and "(ABOVE 0)" in out


@pytest.mark.slow
def test_run_gpt2_int8_weight_reports_token_agreement(capsys):
    code = main(["run", "gpt2", "--layers", "1", "--prompt", "8", "--tokens", "5",
                 "--profile", "never", "--db", ":memory:", "--quantize", "int8-weight"])
    captured = capsys.readouterr()
    out = captured.out
    assert code == 0, out + captured.err
    agree = re.search(r"(\d+) of 5 tokens agree \(at least 90%\)", out)
    assert agree and int(agree.group(1)) == 5
    assert re.search(r"decode: int8-weight [\d.]+ ms/token, float32 [\d.]+ ms/token", out)
    assert "c_q8_matmul" in out.split("fused or whole:")[1]


def test_run_quantize_choices(capsys):
    with pytest.raises(SystemExit):
        main(["run", "minilm", "x", "--quantize", "int3"])
    assert "int8-dynamic" in capsys.readouterr().err
