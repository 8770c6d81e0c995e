"""Under load: tensor_graphs and torch eager while busy processes compete for the cores.

    python benchmarks/contention.py [--quick] [--only minilm] [--competitors 0,1,3]
                                    [--rounds 16] [--seconds 420] [--whole-team]

GPT-2 2-layer prefill (1 x 128), MiniLM (8 x 128) and MiniLM on three short sentences (3 x 8
tokens, `tg run minilm`'s kind of input: ~100 short steps), built by benchmarks/models.py
(its model builders and runners, imported), each run by ``ours`` (``tg.from_torch``) and
``eager`` (the torch module under ``torch.no_grad``) in one process, with 0, 1 and 3 competing
processes that each spin one core (``while True: pass``), each in its own session as another
user's program would be (Linux's autogroup then shares the cores among the sessions).
``--whole-team`` adds ``ours-whole``: ours with the C kernels held to their whole thread team
(``threads.full_team``), as they ran before they learnt to run alone under load. Each runner's
slowdown is its median time with n competitors over its own median with none; the target is
ours no worse than 1.5x eager's at the most competitors.

Interleaving, so the noise of a shared machine falls on every cell alike: a round visits every
competitor count (the order rotates per round), and within one count every workload and every
runner (the order rotates too); each level starts with 0.7 s of untimed calls (the C kernels'
team stays alone 0.5 s after contention ends: steady state at each level), and before each
sample comes one untimed call of the same runner (the steady state of calling it in a loop); a
sample is the mean of back-to-back calls lasting >= 30 ms. CPU ms counts every thread of this
process (spinning shows there); "ours alone" is the share of ours' samples after which the C
kernels' team was one thread. The busy processes are started by this script, at most
``MAX_COMPETITORS`` at once, and each exits by itself at its deadline (at most
``MAX_LIFETIME_S``) or as soon as this script is gone, so a killed run leaves nothing
spinning. ``--quick`` takes ~2 minutes, the default ~5 on 2 cores, plus the
profiling of what the database lacks on a first run (~1 minute).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # noqa: E402,I001  (first: it imports tensor_graphs before numpy and torch)

import torch  # noqa: E402

import tensor_graphs as tg  # noqa: E402
from tensor_graphs import threads  # noqa: E402
from tensor_graphs.numerics import relative_error  # noqa: E402

# `tg run minilm`'s kind of input: a few short sentences (3 x 8 tokens)
SENTENCES = ["the cat sat on the mat", "a dog ran in the park", "stocks fell sharply today"]
WORKLOADS = {  # label -> builder (benchmarks/models.py's)
    "gpt2-2layer prefill 1x128": models.WORKLOADS["gpt2-2layer prefill 1x128"],
    "minilm 8x128": models.WORKLOADS["minilm 8x128"],
    "minilm 3 sentences": lambda: models.minilm(SENTENCES),
}
TARGET = 1.5  # ours' slowdown / eager's at the most competitors, at most
MAX_COMPETITORS = 8  # busy processes at once, at most
MAX_LIFETIME_S = 120.0  # a busy process lives at most this long, whatever it is told

# The competitor: spins one core until its deadline, or until its parent (this script) is gone
# (then getppid() changes), checking every ~1 ms of spinning.
BUSY = """
import os, sys, time
deadline, parent = float(sys.argv[1]), int(sys.argv[2])
while time.time() < deadline and os.getppid() == parent:
    for _ in range(20000):
        pass
"""


class Competitors:
    """``n`` busy processes for at most ``seconds``; stopped on leaving the ``with``."""

    def __init__(self, n: int, seconds: float):
        if not 0 <= n <= MAX_COMPETITORS:
            raise SystemExit(f"contention.py: competitors must be 0..{MAX_COMPETITORS}, got {n}")
        self.n, self.seconds = n, min(seconds, MAX_LIFETIME_S)
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> Competitors:
        deadline = time.time() + self.seconds
        try:
            for _ in range(self.n):
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-S", "-c", BUSY, repr(deadline), str(os.getpid())],
                    stdin=subprocess.DEVNULL, start_new_session=True))
        except BaseException:
            self.__exit__()
            raise
        if self.n:
            time.sleep(0.2)  # started and spinning
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait()
        self.procs = []


def whole_team(fn):
    def run():
        with threads.full_team():
            return fn()
    return run


def build(names, profile, whole) -> dict[str, dict[str, object]]:
    """Each workload's runners, checked against eager and called once."""
    calls = {}
    for label in names:
        module, args = WORKLOADS[label]()
        ref = models._array(models.eager(module, args, profile)())
        calls[label] = {}
        for runner in ("ours", "eager"):
            start = time.perf_counter()
            fn = getattr(models, runner)(module, args, profile)
            err = relative_error(models._array(fn()), ref)
            if not err <= 1e-3:
                raise SystemExit(f"contention.py: {runner} on {label}: relative error {err:.1e}")
            fn()
            calls[label][runner] = fn
            print(f"# {label}, {runner}: setup {time.perf_counter() - start:.1f} s, "
                  f"error {err:.1e}", flush=True)
        if whole:
            calls[label]["ours-whole"] = whole_team(calls[label]["ours"])
    return calls


def rotate(seq, r):
    seq = list(seq)
    return seq[r % len(seq):] + seq[:r % len(seq)]


def timed(fn, least_s: float = 0.03) -> tuple[float, float]:
    """Milliseconds a call, wall and CPU (all of this process's threads: spinning shows here),
    over back-to-back calls lasting at least ``least_s``."""
    calls, start, cpu = 0, time.perf_counter(), time.process_time()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= least_s:
            return elapsed * 1e3 / calls, (time.process_time() - cpu) * 1e3 / calls


def settle(calls, seconds: float = 0.7) -> None:
    """Untimed calls of ours for ``seconds``, so the C kernels' team has adapted to the new
    competitor count: after contention ends it stays alone 0.5 s, which would otherwise fall
    on the first samples of the next level."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for w in calls:
            calls[w]["ours"]()


def measure(calls, levels, rounds, budget_s, pause) -> dict:
    """samples[(workload, runner, competitors)] -> [(wall ms, CPU ms, team)]; stops once
    ``budget_s`` has passed (after at least one round)."""
    samples = {(w, r, n): [] for w in calls for r in calls[w] for n in levels}
    end = time.perf_counter() + budget_s
    for rnd in range(rounds):
        if rnd and time.perf_counter() > end:
            print(f"# time bound reached after {rnd} rounds", flush=True)
            break
        per_level = max(5.0, (end - time.perf_counter()) / max(1, rounds - rnd) / len(levels))
        for n in rotate(levels, rnd):
            with Competitors(n, 4 * per_level + 10):
                settle(calls)
                for w in rotate(calls, rnd):
                    for r in rotate(calls[w], rnd + n):
                        time.sleep(pause)
                        calls[w][r]()  # untimed: this runner's pools awake
                        wall, cpu = timed(calls[w][r])
                        samples[w, r, n].append((wall, cpu, threads.team()))
    return samples


def table(samples, levels) -> bool:
    """Prints the table; True when the target holds for every workload."""
    most = max(levels)
    ok = True
    runners = list(dict.fromkeys(k[1] for k in samples))
    extra = [r for r in runners if r not in ("ours", "eager")]
    print("\n| workload | competitors | ours ms | eager ms | ours slowdown | eager slowdown "
          "| ours/eager slowdown | target | ours CPU ms | eager CPU ms | ours alone"
          + "".join(f" | {r} ms | {r} slowdown" for r in extra) + " |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:" + "|---:|---:" * len(extra)
          + "|")
    for w in dict.fromkeys(k[0] for k in samples):
        def med(r, n, i=0, w=w):  # i: 0 wall, 1 CPU
            return statistics.median(s[i] for s in samples[w, r, n])
        for n in levels:
            slow = {r: med(r, n) / med(r, levels[0]) for r in runners}
            ratio = slow["ours"] / slow["eager"]
            verdict = ""
            if n == most and n > 0:
                met = ratio <= TARGET
                ok &= met
                verdict = f"{'met' if met else 'MISSED'} (<= {TARGET})"
            alone = sum(s[2] == 1 for s in samples[w, "ours", n]) / len(samples[w, "ours", n])
            print(f"| {w} | {n} | {med('ours', n):.1f} | {med('eager', n):.1f} | "
                  f"{slow['ours']:.2f} | {slow['eager']:.2f} | {ratio:.2f} | {verdict} | "
                  f"{med('ours', n, 1):.1f} | {med('eager', n, 1):.1f} | {alone:.0%}"
                  + "".join(f" | {med(r, n):.1f} | {slow[r]:.2f}" for r in extra) + " |")
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="~2 minutes: 5 rounds, 75 s bound")
    ap.add_argument("--only", default="", help="workloads whose name contains this text")
    ap.add_argument("--competitors", default="0,1,3",
                    help="busy processes per level, the first the quiet reference (default "
                         f"0,1,3; at most {MAX_COMPETITORS})")
    ap.add_argument("--rounds", type=int, default=None,
                    help="rounds over every level (default 16, --quick 5)")
    ap.add_argument("--seconds", type=float, default=None,
                    help="bound on the measuring time, after setup (default 360, --quick 75)")
    ap.add_argument("--pause", type=float, default=0.05,
                    help="seconds of sleep before each untimed + timed pair (default 0.05)")
    ap.add_argument("--whole-team", action="store_true",
                    help="add ours-whole: the C kernels held to their whole team under load")
    ap.add_argument("--threads", type=int, default=None, help="threads for every pool")
    ap.add_argument("--profile", choices=("missing", "never"), default="missing",
                    help="ours: measure kernels the database lacks before planning (default)")
    args = ap.parse_args(argv)
    try:
        levels = [int(x) for x in args.competitors.split(",")]
    except ValueError:
        levels = []
    if not levels or any(not 0 <= n <= MAX_COMPETITORS for n in levels) or len(levels) < 2:
        ap.error(f"--competitors: two or more counts 0..{MAX_COMPETITORS}, e.g. 0,1,3; got "
                 f"{args.competitors!r}")
    if (args.rounds is not None and args.rounds < 1) or (args.seconds or 1) <= 0:
        ap.error("--rounds and --seconds must be positive")
    rounds = args.rounds or (5 if args.quick else 16)
    seconds = args.seconds or (75.0 if args.quick else 360.0)
    names = [w for w in WORKLOADS if args.only in w]
    if not names:
        ap.error(f"--only {args.only!r} matches none of: {', '.join(WORKLOADS)}")
    if args.threads:
        threads.set_num_threads(args.threads)
    load = os.getloadavg()
    print(f"# contention: {threads.get_num_threads()} threads ({threads.source()}), "
          f"{threads.cores()} cores, competitors {levels}, {rounds} rounds, torch "
          f"{torch.__version__} ({torch.get_num_threads()} threads), tensor_graphs "
          f"{tg.__version__}, load average {load[0]:.2f} before", flush=True)
    if load[0] > 0.5:
        print("# the machine is not quiet: the 0-competitor times include other work")
    for var in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "OPENBLAS_THREAD_TIMEOUT"):
        if var in os.environ:
            print(f"# {var}={os.environ[var]}")
    calls = build(names, args.profile, args.whole_team)
    samples = measure(calls, levels, rounds, seconds, args.pause)
    ok = table(samples, levels)
    print(f"\n# {min(len(s) for s in samples.values())} samples a cell, medians; load average "
          f"{os.getloadavg()[0]:.2f} after (this run's own load included)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
