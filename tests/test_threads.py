"""The user's thread settings and the C kernels' team under contention (tensor_graphs.threads).

Each setting is read once per process, so every case runs in a fresh Python process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from tensor_graphs import threads

SETTINGS = ("TG_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
C_CALL = "import numpy as np; tg.kernels.get('c_exp')(np.ones(100_000, np.float32))"


def child(script: str, child_env, timeout: float = 300, **env) -> subprocess.CompletedProcess:
    """``script`` in a fresh process, with only the thread settings given here."""
    base = {k: v for k, v in child_env.items() if k not in SETTINGS}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)],
                          env=dict(base, **env), capture_output=True, text=True,
                          timeout=timeout)


# (environment, torch.set_num_threads before importing tensor_graphs or None,
#  expected count, its source, torch's count after a C and a torch kernel ran)
ORDER = [
    ({"TG_NUM_THREADS": "1", "OMP_NUM_THREADS": "2"}, 2, 1, "TG_NUM_THREADS", 1),
    ({"OMP_NUM_THREADS": "1"}, None, 1, "OMP_NUM_THREADS", 1),
    ({"OMP_NUM_THREADS": "3,1"}, 1, 3, "OMP_NUM_THREADS", 1),  # torch keeps the user's
    ({}, 1, 1, "torch", 1),  # was: reset to 2 by the first C kernel
    ({}, None, threads.cores(), "cores", None),
]


@pytest.mark.parametrize("env, torch_before, count, source, torch_after", ORDER)
def test_the_count_follows_the_users_settings_in_order(env, torch_before, count, source,
                                                        torch_after, child_env):
    pytest.importorskip("torch")
    setup = f"torch.set_num_threads({torch_before})" if torch_before else "pass"
    res = child(f"""
        import torch
        {setup}
        default = torch.get_num_threads()
        import tensor_graphs as tg
        {C_CALL}
        tg.kernels.get('torch_neg')(np.ones(3, np.float32))
        after = torch.get_num_threads()
        print(tg.threads.get_num_threads(), tg.threads.source(), after, default)
    """, child_env, **env)
    assert res.returncode == 0, res.stderr
    n, src, after, default = res.stdout.split()
    assert (int(n), src) == (count, source)
    assert int(after) == (torch_after if torch_after is not None else int(default))


def test_torch_imported_later_keeps_its_count_and_an_explicit_setting_reaches_it(child_env):
    pytest.importorskip("torch")
    res = child(f"""
        import tensor_graphs as tg
        {C_CALL}
        import torch
        torch.set_num_threads(1)
        tg.kernels.get('torch_neg')(np.ones(3, np.float32))  # tensor_graphs meets torch
        kept = torch.get_num_threads()
        tg.threads.set_num_threads(2)
        print(kept, torch.get_num_threads(), tg.threads.source())
    """, child_env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["1", "2", "set_num_threads"]


@pytest.mark.parametrize("value", ["abc", "0", "-2"])
def test_a_bad_omp_num_threads_is_a_clear_error(value, child_env):
    res = child(f"import tensor_graphs as tg\n{C_CALL}", child_env, OMP_NUM_THREADS=value)
    assert res.returncode != 0
    assert "ArgumentError: OMP_NUM_THREADS must be a positive integer" in res.stderr
    assert repr(value) in res.stderr and "unset it" in res.stderr


def test_team_rule(child_env):
    """tg_team_look, fed a thread's counters (ns on a core, ns waiting for one): two decisions
    in a row where it waited >= 1/8 of the time it wanted a core (over >= 5 ms of wanting) make
    the team 1 until 0.5 s after the last such look (one alone does not); a look from another
    thread only takes its counters; a new setting starts over; full_team reads the setting."""
    res = child("""
        import ctypes
        from tensor_graphs import threads
        from tensor_graphs.kernels.c import lib
        threads.set_num_threads(2)
        look = lib.library('elementwise').tg_team_look
        look.argtypes = [ctypes.c_int64] * 4
        look.restype = ctypes.c_int
        ms = 10**6
        seen = [look(1000 * ms, 0, 0, 7),               # the first look: counters only
                look(1010 * ms, 10 * ms, 1 * ms, 7),     # waited 1/11: quiet
                look(1020 * ms, 11 * ms, 2 * ms, 7),     # 1/2, but wanted 2 ms: no decision
                look(1030 * ms, 14 * ms, 6 * ms, 7),     # 5/9 since 1010: contended, once
                look(1040 * ms, 16 * ms, 12 * ms, 7),    # 6/8: contended twice in a row
                threads.team()]
        with threads.full_team():
            seen.append(threads.team())
        seen += [look(1400 * ms, 25 * ms, 12 * ms, 7),   # quiet, held
                 look(1520 * ms, 35 * ms, 12 * ms, 7),   # quiet, held (until 1540)
                 look(1545 * ms, 45 * ms, 12 * ms, 7),   # quiet, 0.5 s after: the team again
                 look(1550 * ms, 46 * ms, 16 * ms, 8),   # another thread: its counters only
                 look(1560 * ms, 56 * ms, 16 * ms, 8),   # waited 0: quiet
                 look(1570 * ms, 57 * ms, 26 * ms, 8),   # contended once: still the team
                 look(1580 * ms, 67 * ms, 26 * ms, 8),   # quiet: the count starts over
                 look(1590 * ms, 68 * ms, 36 * ms, 8)]   # contended once again: the team
        look(1600 * ms, 69 * ms, 46 * ms, 8)             # twice in a row: 1
        threads.set_num_threads(2)
        seen.append(threads.team())
        print(*seen)
    """, child_env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == "2 2 2 2 1 1 2 1 1 2 2 2 2 2 2 2".split()


def _busy(n: int, seconds: float) -> list[subprocess.Popen]:
    """``n`` processes spinning a core each, gone after ``seconds`` or with this one."""
    code = ("import os, sys, time\nend, parent = float(sys.argv[1]), int(sys.argv[2])\n"
            "while time.time() < end and os.getppid() == parent:\n"
            "    for _ in range(20000): pass\n")
    return [subprocess.Popen([sys.executable, "-S", "-c", code, str(time.time() + seconds),
                              str(os.getpid())], start_new_session=True)
            for _ in range(n)]


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"),
                    reason="the team adapts where Linux reports scheduling delays")
def test_the_team_shrinks_while_other_processes_want_the_cores(child_env):
    """With more busy processes than cores, the C kernels' regions (and OpenBLAS's calls) run
    on the calling thread alone; under full_team (the profiler) on the whole setting."""
    script = """
        import time
        import numpy as np
        import tensor_graphs as tg
        threads = tg.threads
        threads.set_num_threads(2)
        x, y = np.ones(1_000_000, np.float32), np.empty(1_000_000, np.float32)
        a, b = np.ones((64, 384), np.float32), np.ones((384, 384), np.float32)
        exp, matmul = tg.kernels.get('c_exp'), tg.kernels.get('c_matmul')
        print('ready', flush=True)
        input()
        end, teams = time.monotonic() + 5, set()
        while time.monotonic() < end and 1 not in teams:
            exp(x, out=y)
            teams.add(threads.team())
        matmul(a, b)
        alone = threads.openblas_num_threads()
        with threads.full_team():
            matmul(a, b)
            pinned = (threads.team(), threads.openblas_num_threads())
        print(1 in teams, alone, *pinned)
    """
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)],
                            env={k: v for k, v in child_env.items() if k not in SETTINGS},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    busy = []
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        busy = _busy(threads.cores() + 1, 30)
        out, err = proc.communicate("go\n", timeout=120)
    finally:
        proc.kill()
        for p in busy:
            p.kill()
            p.wait()
    assert proc.returncode == 0, err
    shrank, alone, pinned_team, pinned_blas = out.split()
    assert shrank == "True"
    if alone != "None":  # scipy-openblas32 is installed: its threads follow the team
        assert (alone, pinned_blas) == ("1", "2")
    assert pinned_team == "2"


def test_every_blas_pool_in_the_process_follows_the_count(child_env):
    """threadpoolctl's view: numpy's own OpenBLAS and the C backend's scipy-openblas32 (loaded
    by tensor_graphs so the C libraries find the count) both take each setting; OpenMP pools
    are left alone unless the count is one the user asked tensor_graphs for."""
    res = child("""
        import tensor_graphs as tg
        import numpy as np
        from threadpoolctl import threadpool_info
        np.ones((64, 64)) @ np.ones((64, 64))
        seen = []
        for n in (1, 2):
            tg.threads.set_num_threads(n)
            blas = [p for p in threadpool_info() if p["user_api"] == "blas"]
            seen.append(sorted({p["num_threads"] for p in blas}))
            seen.append(len(blas))
        print(*seen, tg.threads.openblas_num_threads())
    """, child_env)
    assert res.returncode == 0, res.stderr
    ones, n1, twos, n2, scipy_blas = res.stdout.split()
    assert ones == "[1]" and twos == "[2]"
    assert int(n1) == int(n2) >= 2  # numpy's and scipy-openblas32's
    assert scipy_blas == "2"


def test_numpys_blas_follows_the_team_inside_numpy_matmul_only(child_env):
    """numpy_matmul runs numpy's own OpenBLAS on the C kernels' team: one thread while the team
    is short (its call waits for every worker, and at load 7-8 on 2 cores a (8, 128, 256) @
    (256, 256) took 35 ms median on 2 threads against 1.1 ms on one), the setting under the
    profiler's full team, and the user's numpy outside the kernel keeps the setting (or the
    user's own limit)."""
    res = child("""
        import ctypes
        import numpy as np
        from threadpoolctl import threadpool_info, threadpool_limits
        import tensor_graphs as tg
        from tensor_graphs import threads
        from tensor_graphs.kernels.c import lib
        from tensor_graphs.kernels.numpy import atomic
        threads.set_num_threads(2)
        def pool():  # numpy's own OpenBLAS (in its wheel's numpy.libs), as threadpoolctl sees it
            found = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"
                     and p["filepath"].split("/")[-2] in ("numpy.libs", "numpy")]
            assert len(found) == 1, threadpool_info()
            return found[0]
        seen, inner = [], atomic.ufunc
        def spy(*args):
            seen.append(pool())
            return inner(*args)
        atomic.ufunc = spy
        matmul = tg.kernels.get("numpy_matmul")
        a, b = np.ones((8, 16, 32), np.float32), np.ones((32, 8), np.float32)
        matmul(a, b)                                     # quiet: the setting
        look = lib.library("elementwise").tg_team_look
        look.argtypes = [ctypes.c_int64] * 4
        look.restype = ctypes.c_int
        ms = 10**6
        look(1000 * ms, 0, 0, 7)
        look(1030 * ms, 14 * ms, 6 * ms, 7)              # contended
        look(1040 * ms, 16 * ms, 12 * ms, 7)             # again: the team is 1 for 0.5 s
        matmul(a, b)                                     # numpy's pool on the team
        after = pool()                                   # the setting again
        with threadpool_limits(limits=1, user_api="blas"):
            matmul(a, b)
            limited = pool()                             # the user's own limit is kept
        with threads.full_team():
            matmul(a, b)                                 # the profiler: the whole setting
        print(*seen, after, limited, threads.team())
    """, child_env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == "2 1 1 2 2 1 1".split()


@pytest.mark.parametrize("line", ["import tensor_graphs", "from tensor_graphs import threads"])
def test_the_late_import_warning_points_at_the_users_import(line, tmp_path, child_env):
    """Imported after numpy, tensor_graphs warns; the warning names the user's import line
    (where to move it), not the package's own import of its threads module."""
    script = tmp_path / "user.py"
    script.write_text(f"import numpy\n{line}\n", encoding="utf-8")
    env = {k: v for k, v in child_env.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    done = subprocess.run([sys.executable, "-W", "always", str(script)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert f"{script}:2: RuntimeWarning: tensor_graphs was imported after numpy" \
        in done.stderr, done.stderr
