"""What a new user's first run costs: ``tg.from_torch(..., profile="missing")`` on a fresh
database, its time and measured calls, and the plan it gives (predicted and measured).

    OMP_NUM_THREADS=2 python benchmarks/fresh_profile.py [--layers 2] [--runs 3]
                                                         [--repeats 15] [--modes every,on,off]

Each run is a child process (a fresh process: no kernel built or verified in memory) on a new
empty database; the C cache stays warm unless ``--cold-cache`` (then compiles count too). It
prints, per run: seconds of ``from_torch``, rows measured, generated kernels refused, the plan's
steps and generated steps, the plan's predicted ms, the steps whose time is not a measurement
(a plan should rest on measurements after ``profile="missing"``) and the measured ms per call
(median of ``--repeats`` after two warm-up calls); "generated s" and "registered s" split the
profile's verification and timing seconds between the two kinds of kernels (a window's time
shared by its calls), the figure that a loaded machine moves least. ``--replay``: the plan of a
profile that measures what could win against one that measures every call, on the same
(copied) rows.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, statistics, sys, time
import tensor_graphs as tg
import torch
from transformers import GPT2Config, GPT2LMHeadModel

layers, repeats, mode, db = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
generate = mode != "off"
from tensor_graphs.profiler import missing

if mode == "every":  # every generated candidate measured (before the calibrated estimates)
    missing.MEASURE_EVERY_GENERATED = True
spent = {"generated": 0.0, "registered": 0.0}  # profiling seconds: build, verify and timing
_verified, _together = missing.verified, missing.measure_together


def _generated(k):
    return bool(getattr(k, "generated", False))


def verified(kernel):
    t = time.perf_counter()
    try:
        return _verified(kernel)
    finally:
        spent["generated" if _generated(kernel) else "registered"] += time.perf_counter() - t


def together(calls, *a, **kw):  # a window's time, shared by its calls
    t = time.perf_counter()
    rows = _together(calls, *a, **kw)
    share = (time.perf_counter() - t) / max(len(calls), 1)
    for c in calls:
        spent["generated" if _generated(c.kernel) else "registered"] += share
    return rows


missing.verified, missing.measure_together = verified, together
if mode == "replay":  # rows copied from a database that measured every call: no clock
    from tensor_graphs.db.store import Database

    full = Database(sys.argv[5])

    def copied(options, hardware=None):
        for i in range(0, len(options), missing.WINDOW):
            yield [(o, full.lookup(o.kernel.name, o.signature, missing.hardware_of(o, hardware),
                                   o.kernel.source_hash)) for o in options[i:i + missing.WINDOW]]

    missing.measure_options = copied


class Logits(torch.nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids):
        return self.lm(input_ids=input_ids, use_cache=False).logits


torch.manual_seed(0)
cfg = GPT2Config(n_layer=layers, attn_implementation="sdpa")
ids = torch.randint(0, cfg.vocab_size, (1, 128))
module = Logits(GPT2LMHeadModel(cfg).eval())
start = time.perf_counter()
prog = tg.from_torch(module, (ids,), profile="missing", db=db, generate=generate)
setup = time.perf_counter() - start
inner = getattr(prog, "program", prog)
plan = inner.plan
feeds = ids.numpy()
for _ in range(2):
    prog(feeds)
times = []
for _ in range(repeats):
    t = time.perf_counter()
    prog(feeds)
    times.append(time.perf_counter() - t)
steps = plan.per_call
print(json.dumps({
    "setup_s": setup,
    "measured": inner.stats.get("measured", 0),
    "refused": inner.stats.get("generated_refused", 0),
    "steps": len(steps),
    "generated": sum(1 for s in steps if getattr(s.kernel, "generated", False)),
    "unmeasured": sorted(s.kernel.name for s in steps
                         if s.source not in ("measured", "free") and not s.kernel.view),
    "predicted_ms": plan.cost * 1e3,
    "measured_ms": statistics.median(times) * 1e3,
    "min_ms": min(times) * 1e3,
    "plan": [s.kernel.name for s in steps],
    "generated_s": spent["generated"],
    "registered_s": spent["registered"],
}))
"""


def run_once(layers: int, repeats: int, mode: str, cold_cache: bool, keep: str | None = None,
             full: str | None = None) -> dict:
    """One child on a fresh database (kept at ``keep`` when given; ``full``: the database a
    "replay" copies its rows from)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ)
        if cold_cache:
            env["TG_CACHE_DIR"] = os.path.join(tmp, "cache")
        db = keep or os.path.join(tmp, "fresh.db")
        out = subprocess.run([sys.executable, "-c", CHILD, str(layers), str(repeats), mode,
                              db, *([full] if full else [])], env=env, capture_output=True,
                             text=True, check=False)
        if out.returncode != 0:
            raise SystemExit(out.stderr[-4000:])
        return json.loads(out.stdout.strip().splitlines()[-1])


def replay(layers: int) -> None:
    """The selection's plan quality without the clock's noise: a profile measuring every call,
    then one measuring only what could win with its rows copied from the first; both plans are
    then costed on the same times."""
    with tempfile.TemporaryDirectory() as tmp:
        full = os.path.join(tmp, "full.db")
        every = run_once(layers, 3, "every", False, keep=full)
        some = run_once(layers, 3, "replay", False, full=full)
    print(f"\nreplay: every call measured: {every['measured']} calls, plan predicted "
          f"{every['predicted_ms']:.2f} ms ({every['generated']} generated steps); measuring "
          f"what could win, rows copied from it: {some['measured']} calls, plan predicted "
          f"{some['predicted_ms']:.2f} ms ({some['generated']} generated steps), same plan: "
          f"{every['plan'] == some['plan']}, unmeasured steps: {some['unmeasured'] or 'none'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--modes", default="every,on",
                    help="comma-separated: on (generated kernels measured where they could "
                         "win), every (every generated kernel measured: the old profile), off "
                         "(generate=False)")
    ap.add_argument("--cold-cache", action="store_true")
    ap.add_argument("--replay", action="store_true",
                    help="also compare the plans on copied rows (see ``replay``)")
    args = ap.parse_args()
    modes = args.modes.split(",")
    print(f"GPT-2 {args.layers}-layer 1x128, from_torch(profile='missing') on a fresh database"
          f"{', cold C cache' if args.cold_cache else ''}; load {os.getloadavg()[0]:.1f}")
    print("| mode | setup s | generated s | registered s | measured | refused | "
          "steps (generated) | predicted ms | measured ms (min) | unmeasured steps |")
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|---|")
    for _ in range(args.runs):
        for mode in modes:  # interleaved: both modes see the same load
            r = run_once(args.layers, args.repeats, mode, args.cold_cache)
            print(f"| {mode} | {r['setup_s']:.1f} | {r['generated_s']:.1f} | "
                  f"{r['registered_s']:.1f} | {r['measured']} | {r['refused']} | "
                  f"{r['steps']} ({r['generated']}) | {r['predicted_ms']:.1f} | "
                  f"{r['measured_ms']:.1f} ({r['min_ms']:.1f}) | "
                  f"{', '.join(r['unmeasured']) or '-'} |", flush=True)
    if args.replay:
        replay(args.layers)


if __name__ == "__main__":
    main()
