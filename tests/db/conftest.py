"""Shared helpers for the measurement database tests."""

from __future__ import annotations

import pytest

from tensor_graphs.db import Hardware, Measurement, current, signature_text

OTHER_MACHINE = "another-box"


def measurement(kernel: str = "numpy_add", n: int = 4, median: float = 1e-5,
                source_hash: str = "h1", **kw) -> Measurement:
    """A successful measurement of ``kernel`` on a (n, n) float32 pair."""
    sig = signature_text([((n, n), "float32"), ((n, n), "float32")], {})
    return Measurement(kernel, source_hash, sig, runs=10, median=median, min=median * 0.9,
                       max=median * 1.5, error=1e-7, **kw)


@pytest.fixture
def mk():
    return measurement


@pytest.fixture
def elsewhere() -> Hardware:
    """This device and libs on another machine: its timings transfer here."""
    hw = current()
    return Hardware(OTHER_MACHINE, hw.device, hw.libs)
