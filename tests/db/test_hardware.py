"""The hardware key: three layers, cached, and built without importing torch."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

from tensor_graphs.db import Hardware, current


def test_current_cpu_key():
    hw = current()
    assert hw is current("cpu")  # cached
    assert hw.device.startswith("cpu|") and hw.device.endswith(("core", "cores"))
    assert f"numpy {metadata.version('numpy')}" in hw.libs.split("|")
    assert len(hw.key) == 12 and int(hw.key, 16) >= 0
    assert hw.key == Hardware(hw.machine, hw.device, hw.libs).key
    assert hw.key != Hardware("x", hw.device, hw.libs).key
    assert hw.device_key == Hardware("x", hw.device, hw.libs).device_key


def test_current_does_not_import_torch():
    code = ("import sys; from tensor_graphs.db import hardware; before = 'torch' in "
            "sys.modules; hardware.current(); print(before, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[1] == out[0]


def test_the_simulated_gpu_has_a_key_of_its_own(simulate_gpu):
    """Its kernels run on this CPU: its rows are CPU times, so they are filed apart from a
    real GPU's ("cuda|<name>|sm ...") and from this CPU's own, under a key that names the
    CPU (a simulation on another CPU times differently)."""
    from tensor_graphs.db import hardware

    simulate_gpu("1")
    key = hardware._other_device("cuda")
    assert key == "cuda|simulated|" + current("cpu").device
    assert key != current("cpu").device
    simulate_gpu("0")  # off: a real GPU's key, or none here
    assert not hardware._other_device("cuda").startswith("cuda|simulated")
