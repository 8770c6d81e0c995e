"""The layered hardware key a measurement is filed under.

Three layers, coarse to fine in what they change: ``machine`` (this box: a measurement taken
here is preferred), ``device`` (what the kernel ran on: CPU model, the SIMD flags that change
which code paths run, core count; or GPU name, compute capability and driver; the simulated
GPU is "cuda|simulated|" and the CPU's layer) and ``libs`` (the backend library
versions and C compiler that produced the code). Timings transfer between machines that share
the device and libs layers, so lookups match on those two and only *prefer* the machine.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import socket
import subprocess
from dataclasses import dataclass
from importlib import metadata

from tensor_graphs.devices import simulated_cuda

# SIMD features that decide which kernels (BLAS, compiler auto-vectorisation) run.
SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
              "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8",
              "asimd", "sve", "sve2")
LIBS = ("numpy", "torch", "scipy-openblas32")


@dataclass(frozen=True)
class Hardware:
    """Where a measurement was taken: ``machine``, ``device`` and ``libs`` layers (strings)."""

    machine: str
    device: str
    libs: str

    @property
    def key(self) -> str:
        """A short hash of all three layers (for display and grouping)."""
        return _short_hash(self.machine, self.device, self.libs)

    @property
    def device_key(self) -> str:
        """A short hash of the device and libs layers: what timings transfer across."""
        return _short_hash(self.device, self.libs)


def _short_hash(*parts: str) -> str:
    return hashlib.blake2b("\n".join(parts).encode(), digest_size=6).hexdigest()


def current(device_kind: str = "cpu") -> Hardware:
    """This process's hardware for kernels of ``device_kind`` ("cpu" or "cuda"); cached."""
    return _current(device_kind)


@functools.cache
def _current(device_kind: str) -> Hardware:
    device = _cpu_device() if device_kind == "cpu" else _other_device(device_kind)
    return Hardware(machine=_machine(), device=device, libs=_libs())


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """The first processor block of /proc/cpuinfo (empty where there is none)."""
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    if info:
                        break
                    continue
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info


def _cpu_model() -> str:
    info = _cpuinfo()
    return (info.get("model name") or info.get("Model") or info.get("Hardware")
            or platform.processor() or platform.machine() or "unknown cpu")


def _machine() -> str:
    """A fingerprint of this machine: machine-id (else hostname) plus the CPU model."""
    ident = ""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(path, encoding="utf-8") as f:
                ident = f.read().strip()
        except OSError:
            continue
        if ident:
            break
    return _short_hash(ident or socket.gethostname(), _cpu_model())


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _cpu_device() -> str:
    info = _cpuinfo()
    present = set((info.get("flags") or info.get("Features") or "").split())
    flags = ",".join(f for f in SIMD_FLAGS if f in present) or platform.machine() or "-"
    cores = _cores()
    return f"cpu|{_cpu_model()}|{flags}|{cores} core{'s' if cores != 1 else ''}"


SIMULATED_GPU = "cuda|simulated"  # the device layer's head for the simulated GPU (devices.py)


def _other_device(kind: str) -> str:
    """GPU name and driver via torch (imported only here, when a GPU key is asked for). The
    simulated GPU (``TG_SIMULATED_CUDA``) runs its kernels on this CPU, so its key is its own,
    "cuda|simulated|" and the CPU's layer: its timings are CPU times and must never land in a
    real GPU's rows, nor in those of a simulation on another CPU. It wins over a real GPU, as
    in ``devices.simulated_cuda``."""
    if kind != "cuda":
        return kind
    if simulated_cuda() is not None:
        return f"{SIMULATED_GPU}|{_cpu_device()}"
    try:
        import torch

        if not torch.cuda.is_available():
            return "cuda|unavailable"
        name = torch.cuda.get_device_name(0)
        cap = ".".join(map(str, torch.cuda.get_device_capability(0)))
    except Exception:  # noqa: BLE001 - no torch, or a broken CUDA setup: no GPU key
        return "cuda|unavailable"
    return f"cuda|{name}|sm {cap}|driver {_gpu_driver()}|cuda {torch.version.cuda}"


@functools.cache
def _gpu_driver() -> str:
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as f:
            words = f.readline().split()
        return next(w for w in words if w[:1].isdigit() and "." in w)
    except (OSError, StopIteration):
        pass
    out = _first_line(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return out or "unknown"


@functools.cache
def _libs() -> str:
    """Backend library versions from package metadata (nothing is imported) and the C compiler."""
    parts = []
    for name in LIBS:
        try:
            parts.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    parts.append(_first_line(["cc", "--version"]) or "cc none")
    return "|".join(parts)


def _first_line(command: list[str]) -> str:
    """The first line a command prints, or "" when it is missing or fails."""
    if shutil.which(command[0]) is None:
        return ""
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else ""
