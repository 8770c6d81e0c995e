"""``save_quantized`` of a generator or an imported module quantized at bind time keeps no
reference to the float weights it was given: it reads them back from the program when it
is called (``CompiledGraph.bound_weights``). Before, both objects held the caller's float
arrays (or the module's tensors) for their lifetime for a save that may never come: on a GPU
build, where the program keeps its own copies on the device, a second host copy of the float
model."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import tensor_graphs as tg  # noqa: E402
from tensor_graphs.kernels.c import build  # noqa: E402
from tensor_graphs.nn import Generator  # noqa: E402
from tensor_graphs.nn.models import GPT2, GPT2Config  # noqa: E402

pytestmark = pytest.mark.skipif(not build.available(), reason="no C compiler")

ATTN = "transformer.h.0.attn.c_attn.weight"


def _config():
    return transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=211,
                                   n_positions=64, initializer_range=0.3, bos_token_id=None,
                                   eos_token_id=None)


def _file(path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(path))


def _same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.slow  # ~12 s on the simulated GPU: two generators compiled
def test_a_gpu_generator_drops_the_float_weights_and_still_saves_them(tmp_path):
    torch.manual_seed(0)
    lm = transformers.GPT2LMHeadModel(_config()).eval()
    weights = {n: t.detach().numpy().copy() for n, t in lm.state_dict().items()}
    probe = weakref.ref(weights[ATTN])
    gen = Generator(GPT2(GPT2Config.from_hf(_config())), weights, vocab_size=211, max_len=24,
                    max_prompt=8, quantize="int8-weight", device="cuda", db=":memory:")
    del weights
    gc.collect()
    assert probe() is None  # the program holds its copy on the GPU; nothing holds the host's
    gen.save_quantized(tmp_path / "gpu.safetensors")
    host = Generator.from_transformers(lm, max_len=24, max_prompt=8, quantize="int8-weight",
                                       db=":memory:")
    host.save_quantized(tmp_path / "host.safetensors")
    saved = _file(tmp_path / "gpu.safetensors")
    assert saved[f"{ATTN}.q"].dtype == np.int8 and ATTN not in saved
    _same(saved, _file(tmp_path / "host.safetensors"))


def test_an_imported_module_on_the_gpu_drops_the_float_weights_and_still_saves_them(tmp_path):
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.ReLU(),
                                 torch.nn.Linear(48, 32)).eval()
    args = (torch.randn(4, 64),)
    weights = {n: t.detach().numpy().copy() for n, t in module.state_dict().items()}
    probe = weakref.ref(weights["0.weight"])
    prog = tg.from_torch(module, args, device="cuda", quantize="int8-weight", weights=weights,
                         db=":memory:")
    del weights
    gc.collect()
    assert probe() is None
    prog.save_quantized(tmp_path / "gpu.safetensors")
    host = tg.from_torch(module, args, quantize="int8-weight", db=":memory:")
    host.save_quantized(tmp_path / "host.safetensors")
    saved = _file(tmp_path / "gpu.safetensors")
    assert saved["0.weight.q"].dtype == np.int8 and "0.weight" not in saved
    _same(saved, _file(tmp_path / "host.safetensors"))
    # and the saved file loads prequantized to the bind-time program's outputs
    loaded = tg.from_torch(module, args, weights=str(tmp_path / "gpu.safetensors"),
                           db=":memory:")
    np.testing.assert_array_equal(np.asarray(loaded(*args)), np.asarray(host(*args)))
