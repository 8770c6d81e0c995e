"""Plan lock files: ``prog.save_plan(path)`` writes the decisions; ``tg.compile(..., plan=path)``
replays them without searching.

The file is JSON (``SCHEMA``): the format and version, the device and tolerance it was planned
for, the kernels used with their source hashes, the predicted time and the decisions in
extraction order.

A lock file pins a plan, so what cannot be replayed exactly as saved within the tolerance asked
for is refused with a ``PlanFileError`` naming the file and the fix (compile without ``plan=``,
then ``save_plan`` again) -- never silently re-planned, since a lock file that quietly re-plans
pins nothing, and never run, since a hand-edited decision for a less accurate kernel would
break the tolerance without a word. Checked here, before anything is planned:

- the file: a regular file only this user (or root) can have written (``check_trusted_file``),
  at most ``MAX_BYTES``, JSON of ``SCHEMA``;
- the device it was planned for, and a tolerance no looser than the one asked for;
- every kernel a decision names: listed in the file's kernel table, registered here, and with
  the source hash recorded (an edited kernel computes, errs and costs differently). A
  generated kernel needs no registration: replay renders it again from the graph (its name is
  the hash of its source) and it is verified before it runs.

Checked as the plan is replayed (``Planner.replay``, where the graph's nodes are known): each
decision is one of its slot's options, and one within the tolerance asked for.
"""

from __future__ import annotations

import json
import math

from tensor_graphs.devices import as_device
from tensor_graphs.errors import PlanFileError
from tensor_graphs.files import (
    atomic_write,
    check_trusted_file,
    parse_json,
    path_of,
    read_regular,
)
from tensor_graphs.kernels import registry
from tensor_graphs.planner.plan import GENERATED, Plan

FORMAT, VERSION = "tensor_graphs.plan", 1
MAX_BYTES = 16 << 20  # GPT-2's lock file is ~10 KB; anything near this was not written by us
FIX = "re-plan: compile without plan= and save the plan again with prog.save_plan"


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite_positive(v) -> bool:
    return _number(v) and math.isfinite(v) and v > 0


def _str_to_str(v) -> bool:
    return isinstance(v, dict) and all(isinstance(x, str) for x in v.values())


def _strings(v) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


# key -> (check of its value, what it must be); every key is checked before any value is used
SCHEMA = {
    "format": (lambda v: v == FORMAT, f'"{FORMAT}"'),
    "version": (lambda v: v == VERSION, f"{VERSION} (the version this tensor_graphs reads)"),
    "device": (lambda v: isinstance(v, str), 'a device name such as "cpu"'),
    "tolerance": (_finite_positive, "a positive finite number"),
    "predicted_seconds": (_number, "a number"),
    "kernels": (_str_to_str, "an object of kernel name -> source hash (strings)"),
    "decisions": (_strings, "a list of decision labels (strings)"),
}

# decision label prefixes that name a kernel after the colon (its source hash is checked)
KERNEL_LABELS = ("kernel:", "copy:")
BLOCK_LABEL = "block:"  # a repeated block's sub-plan: its decisions joined by "|"


def save(plan: Plan, path, settings) -> None:
    data = {
        "format": FORMAT, "version": VERSION,
        "device": settings.device.name, "tolerance": settings.tolerance,
        "predicted_seconds": plan.cost,
        "kernels": {s.kernel.name: s.kernel.source_hash for s in plan.steps},
        "decisions": list(plan.decisions),
    }
    # never half-written; never writable by others, or loading it would refuse it
    with atomic_write(path, what="plan file", only_owner_writes=True,
                      error=PlanFileError) as f:
        json.dump(data, f, indent=1)


def load(path, outputs, device, tolerance) -> list[str]:
    """The decisions of the lock file at ``path``, after every check the module docstring
    lists that does not need the planned graph; raises ``PlanFileError`` naming the file."""
    data = _read(path)
    problems = [f"{key!r} must be {want}, got {_show(data.get(key, _MISSING))}"
                for key, (ok, want) in SCHEMA.items() if key not in data or not ok(data[key])]
    if problems:
        raise PlanFileError(f"plan file {path} is not a valid tensor_graphs plan: "
                            f"{'; '.join(problems)}. Save it again with prog.save_plan")
    asked = as_device(device).name
    if data["device"] != asked:
        raise PlanFileError(f"plan file {path} was planned for {data['device']}, not {asked}; "
                            f"compile for {data['device']}, or {FIX}")
    if data["tolerance"] > tolerance:
        raise PlanFileError(f"plan file {path} was planned at tolerance {data['tolerance']:g}, "
                            f"looser than the {tolerance:g} asked for; {FIX}")
    if not data["decisions"] and data["kernels"]:  # save_plan writes a decision per choice
        raise PlanFileError(f"plan file {path} has an empty \"decisions\" list, yet its "
                            f"\"kernels\" table lists {len(data['kernels'])} kernels: the "
                            f"file was emptied or edited by hand; {FIX}")
    _check_kernels(path, data["kernels"], data["decisions"])
    return list(data["decisions"])


_MISSING = object()


def _show(value) -> str:
    if value is _MISSING:
        return "nothing (the key is missing)"
    text = json.dumps(value) if not isinstance(value, (dict, list)) else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def _read(path) -> dict:
    """The file's JSON object: regular, bounded, trusted, parsed; else ``PlanFileError``."""
    path = path_of(path, "plan file")
    raw = read_regular(path, "plan file", _SAVE_PLAN, PlanFileError, most=MAX_BYTES)
    check_trusted_file(path, "plan file")  # a plan picks the code that runs
    data = parse_json(raw, path, "plan file", FIX, PlanFileError)
    if not isinstance(data, dict):
        raise PlanFileError(f"{path} is not a tensor_graphs plan file (its JSON is a "
                            f"{type(data).__name__}, not an object); {_SAVE_PLAN}")
    return data


_SAVE_PLAN = "give the path of a file written by prog.save_plan"


def kernel_names(label: str) -> list[str]:
    """The kernels a decision label names (a block's label names those of its sub-plan)."""
    parts = label[len(BLOCK_LABEL):].split("|") if label.startswith(BLOCK_LABEL) else [label]
    return [p.split(":", 1)[1] for p in parts if p.startswith(KERNEL_LABELS)]


def generated_names(label: str) -> list[str]:
    """The generated kernels a decision label names: they are made again from the graph on
    replay (their name is the hash of their source, so an edited one cannot match) and
    verified before they run, so they need no registration."""
    parts = label[len(BLOCK_LABEL):].split("|") if label.startswith(BLOCK_LABEL) else [label]
    return [p.split(":", 1)[1] for p in parts if p.startswith(GENERATED + ":")]


def _check_kernels(path, table: dict[str, str], decisions: list[str]) -> None:
    """Every kernel the decisions name is in the file's table, registered, and unedited."""
    for i, label in enumerate(decisions):
        for name in kernel_names(label):
            if name not in table:
                raise PlanFileError(
                    f"plan file {path}: decision {i} ({label[:80]!r}) uses kernel {name!r}, "
                    f"which the file's \"kernels\" table does not list (the file was edited "
                    f"by hand); {FIX}")
    known = {k.name: k.source_hash for k in registry.all()}
    known.update((name, table[name]) for label in decisions
                 for name in generated_names(label) if name in table)
    missing = sorted(k for k in table if k not in known)
    # a kernel no decision names (decisions emptied or cut by hand) is no registration
    # problem: a generated one is only known through the decision that names it
    named = {n for label in decisions for n in (*kernel_names(label), *generated_names(label))}
    unused = [k for k in missing if k not in named]
    if unused:
        held = f"its {len(decisions)} decisions" if decisions else "its decisions list is empty"
        raise PlanFileError(f"plan file {path} lists kernels {unused} that no decision uses "
                            f"({held}): the file was edited by hand or cut short; {FIX}")
    if missing:
        raise PlanFileError(f"plan file {path} uses kernels that are not registered: "
                            f"{missing}; register them (tg.kernels.load) or {FIX}")
    edited = [f"{k} (saved {h}, now {known[k]})" for k, h in table.items() if known[k] != h]
    if edited:
        raise PlanFileError(f"plan file {path}: kernels changed since the plan was saved: "
                            f"{', '.join(edited)}; their errors and costs may differ, so the "
                            f"plan is refused, not re-planned; {FIX}")
