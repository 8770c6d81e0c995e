"""bind_safetensors next to kept state: caches are bound with bind, weights from the file."""

import numpy as np

import tensor_graphs as tg
from tensor_graphs.runtime.weights import write_safetensors


def test_bind_safetensors_skips_kept_states(tmp_path):
    kv = tg.state("kv", ("past", 4))
    new = tg.state_update(kv, tg.input("x", ("seq", 4)), offset="past", axis=0)
    out = (new @ tg.weight("w", (4, 1))).sum(axis=0)
    prog = tg.compile([out, new], db=":memory:", bounds={"past": 8, "seq": 2})
    W = np.arange(4, dtype=np.float32).reshape(4, 1)
    write_safetensors(tmp_path / "w.safetensors", {"w": W})
    prog.bind_safetensors(tmp_path / "w.safetensors", strict=True)  # no kv in the file
    prog.bind(kv=np.zeros((0, 4), np.float32))
    X = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(prog(x=X)[0], X.sum(0) @ W)

