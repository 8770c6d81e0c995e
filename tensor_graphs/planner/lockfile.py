"""Plan lock files: ``prog.save_plan(path)`` writes the decisions; ``tg.compile(..., plan=path)``
replays them without searching.

The file is JSON: the format and version, the structural hash of the prepared graph it was made
for, its dims, device and tolerance, the kernels used with their source hashes (an edited kernel
is reported), the predicted time and the decisions in extraction order. Loading checks the
device and tolerance at once and the graph when the plan is replayed.
"""

from __future__ import annotations

import json

from tensor_graphs.devices import as_device
from tensor_graphs.errors import ArgumentError, SerializationError
from tensor_graphs.files import atomic_write
from tensor_graphs.kernels import registry
from tensor_graphs.planner.plan import Plan

FORMAT, VERSION = "tensor_graphs.plan", 1


def save(plan: Plan, path, settings) -> None:
    data = {
        "format": FORMAT, "version": VERSION,
        "device": settings.device.name, "tolerance": settings.tolerance,
        "predicted_seconds": plan.cost,
        "kernels": {s.kernel.name: s.kernel.source_hash for s in plan.steps},
        "decisions": list(plan.decisions),
    }
    with atomic_write(path) as f:  # never a half-written lock file
        json.dump(data, f, indent=1)


def load(path, outputs, device, tolerance) -> list[str]:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise SerializationError(f"cannot read plan file {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SerializationError(f"{path} is not a tensor_graphs plan file")
    if data.get("version") != VERSION:
        raise SerializationError(f"{path}: plan file version {data.get('version')}, this "
                                 f"tensor_graphs reads version {VERSION}")
    if data["device"] != as_device(device).name:
        raise ArgumentError(f"{path} was planned for {data['device']}, not {device}")
    if float(data["tolerance"]) > float(tolerance):
        raise ArgumentError(f"{path} was planned at tolerance {data['tolerance']:g}, looser than "
                            f"the {tolerance:g} asked for; re-plan without plan=")
    known = {k.name: k.source_hash for k in registry.all()}
    missing = sorted(k for k in data["kernels"] if k not in known)
    if missing:
        raise ArgumentError(f"{path} uses kernels that are not registered: {missing}")
    return list(data["decisions"])
