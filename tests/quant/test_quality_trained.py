"""tg quality on a *trained* model (``tg quality train-char``): the character model of ``tg run
train-char`` trained for a few steps, int8-weight against float32 on held-out windows of its
text. A random-weight model's logits are nearly flat, so near-ties decide its greedy tokens;
a trained one's are not, and int8's per-channel rounding should keep them.

Thresholds from what was measured (150 steps of 16 x 64 characters, validation loss 2.35
nats/char, 4 windows of 64 characters, 48 greedy tokens each): int8-weight agreed on 192 of 192
greedy tokens and 251 of 252 next-token predictions, perplexity 10.469 against 10.467. The
test asks for the issue's 90 % of greedy tokens and 95 % of next tokens, and a perplexity
within 1 %: a wrong scale or a transposed channel axis misses all three."""

import json
import math

import pytest

from tensor_graphs.cli import main
from tensor_graphs.kernels.c import build

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not build.available(), reason="no C compiler")]
SIZES = ["--seq", "64", "--prompt", "16", "--tokens", "48", "--prompts", "4", "--db",
         ":memory:", "-o", "json"]


def rows(capsys) -> dict:
    return {r["measure"]: r["value"] for r in json.loads(capsys.readouterr().out)}


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    return tmp_path_factory.mktemp("char") / "char.safetensors"


def test_int8_weight_keeps_a_trained_models_greedy_tokens(weights, capsys):
    status = main(["quality", "train-char", "--quantize", "int8-weight", "--steps", "150",
                   "--save", str(weights), *SIZES])
    got = rows(capsys)
    assert status == 0 and weights.exists()
    # trained: well below an untrained model's log(vocabulary) = log(103) = 4.63 nats/char
    assert got["float32 loss on the text (nats/char)"] < 2.7
    assert got["greedy tokens"] == 4 * 48
    assert got["greedy tokens agreeing"] >= 0.9 * got["greedy tokens"]
    assert got["greedy tokens agreeing"] == sum(got[f"prompt {i} greedy tokens agreeing"]
                                                for i in range(4))
    assert got["text predictions"] == 4 * 63
    assert got["next-token agreement"] >= 0.95 * got["text predictions"]
    assert abs(got["perplexity difference"]) < 0.01 * got["perplexity (float32)"]
    assert 0 < got["output 0 [1, 1, 103] relative error"] < 0.02


def test_saved_weights_reload_to_the_same_model(weights, capsys):
    if not weights.exists():
        pytest.skip("the training test did not write the weights")
    main(["quality", "train-char", "--quantize", "int8-weight", "--weights", str(weights),
          *SIZES])
    again = rows(capsys)
    status = main(["quality", "train-char", "--quantize", "fp16-weight", "--weights",
                   str(weights), *SIZES])
    fp16 = rows(capsys)
    assert status == 0
    # the file rebuilds the float32 model exactly: the same perplexity whatever the scheme
    assert fp16["perplexity (float32)"] == again["perplexity (float32)"]
    assert math.isclose(fp16["perplexity (quantized)"], fp16["perplexity (float32)"],
                        rel_tol=1e-3)


def test_a_file_without_the_metadata_is_refused(tmp_path, capsys):
    import numpy as np

    from tensor_graphs.errors import ArgumentError
    from tensor_graphs.jobs.train_char import load_weights
    from tensor_graphs.runtime.weights import write_safetensors

    path = tmp_path / "bare.safetensors"
    write_safetensors(path, {"wte.weight": np.zeros((3, 2), np.float32)})
    with pytest.raises(ArgumentError, match="--save"):
        load_weights(path)
