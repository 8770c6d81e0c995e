"""Profiling over a real Ray cluster (``tg profile --ray``): a local multi-node cluster on
loopback (``ray.cluster_utils.Cluster``, started once for the module), measuring a small graph
into a shared SQLite file and a shared PostgreSQL database. Two nodes advertise this machine's
hardware; a third runs pinned to one core, so its CPU's hardware key ("1 core") is another
kind of machine's: it must only ever measure for its own key. A measuring worker killed with
SIGKILL mid-run loses nothing committed and its claims are taken over.

Without Ray these tests skip, unless TG_TEST_RAY=required (CI, which installs the ray extra),
where that is a failure."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import tensor_graphs as tg
from tensor_graphs.db import Database
from tensor_graphs.errors import ClusterError

RAY_REQUIRED = os.environ.get("TG_TEST_RAY") == "required"
ROOT = Path(__file__).resolve().parents[2]
SLOW = pytest.mark.slow  # a cluster start alone takes 5 to 20 s on two busy cores
SHAPES = range(2, 18)  # x * x + x on 16 shapes: 32 calls, four windows of 8
LEASE = 2.0  # seconds: how long a killed worker's claims wait


def _node_args() -> dict:
    # small nodes: the machine has 2 cores; 80 MB object stores (Ray's minimum is 75 MB)
    return {"num_cpus": 1, "object_store_memory": 80 * 1024 * 1024}


def _resources_pinned_to_one_core() -> dict:
    """What a node pinned to one core advertises, asked of a process pinned so."""
    code = ("import json; from tensor_graphs.profiler.ray_profile import node_resources; "
            "print(json.dumps(node_resources()))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, preexec_fn=lambda: os.sched_setaffinity(0, {0}))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def cluster():
    """(address, this machine's resources, the pinned node's) of a 4-node cluster: a head
    without work, two nodes of this machine's kind and one pinned to core 0 (another
    hardware key)."""
    try:
        from ray.cluster_utils import Cluster
    except ImportError as exc:
        if RAY_REQUIRED:
            pytest.fail(f"TG_TEST_RAY=required but Ray is not installed ({exc})")
        pytest.skip(f"no Ray ({exc}): pip install -c constraints.txt -e '.[ray]'")
    from tensor_graphs.profiler.ray_profile import node_resources

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("the other-kind node is pinned to one core of at least two")
    here = node_resources()
    other = _resources_pinned_to_one_core()
    assert set(other) != set(here)  # "1 core" is another hardware key
    env = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # every address 127.0.0.1 (loopback)
           "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                         if p)}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        from ray._private import ray_constants

        mp.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)  # read at import in this process
        folder = tempfile.mkdtemp(prefix="tg-ray-")  # the cluster's sockets, logs, address
        mp.setenv("RAY_TMPDIR", folder)  # (Ray's own default: /tmp/ray)
        made = None
        try:
            made = Cluster(initialize_head=True, head_node_args={
                "num_cpus": 0, "include_dashboard": False,
                "object_store_memory": 80 * 1024 * 1024})
            for _ in range(2):
                made.add_node(resources=here, **_node_args())
            everyone = os.sched_getaffinity(0)
            os.sched_setaffinity(0, {0})  # the raylet and its workers inherit it
            try:
                made.add_node(resources=other, **_node_args())
            finally:
                os.sched_setaffinity(0, everyone)
            assert made.address.startswith("127.0.0.1:")
            _watchdog(made, folder)
            yield made.address, here, other
        finally:
            if made is not None:
                made.shutdown()
            shutil.rmtree(folder, ignore_errors=True)


def _watchdog(made, folder: str) -> None:
    """Should this pytest process die before the teardown (a CI timeout), a detached shell
    kills the cluster's processes by their ids (a raylet's workers exit with it) and removes
    its folder: no node outlives the tests that started it."""
    nodes = [made.head_node, *made.worker_nodes]
    pids = " ".join(str(p.pid) for node in nodes for _, p in node.live_processes())
    subprocess.Popen(["sh", "-c", f"while kill -0 {os.getpid()} 2>/dev/null; do sleep 1; done; "
                      f"kill -9 {pids} 2>/dev/null; rm -rf {folder}"], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)


def _graph(tmp_path) -> Path:
    path = tmp_path / "graph.json"
    xs = [tg.input(f"x{n}", (n, 8)) for n in SHAPES]
    tg.save([x * x + x for x in xs], path)
    return path


def _source(path: Path):
    from tensor_graphs.commands.profile import GraphPlanner

    return GraphPlanner(str(path), path.read_text(), (), "cpu", 1e-5, ("numpy",))


def _rows(db: str) -> list[tuple]:
    with Database(db) as store:
        return [(m.kernel, m.signature, m.hardware.device, m.hardware.libs, m.when)
                for m in store.rows()]


def _target(shared_target: str) -> str:
    if "://" not in shared_target:
        Database(shared_target).close()
    return shared_target


def _check_once(db: str, report, here: dict, other: dict) -> None:
    """Every call measured exactly once per hardware key, each key's rows by its own nodes."""
    rows = _rows(db)
    keys = {r[:4] for r in rows}
    assert len(rows) == len(keys), f"{len(rows)} rows for {len(keys)} calls"
    assert len(keys) == 2 * 2 * len(SHAPES)  # two kernels per shape, two hardware keys
    (mine,), (theirs,) = here, other
    assert set(report.keys) == {mine, theirs}
    for resource in (mine, theirs):
        rep = report.keys[resource]
        assert rep.calls == rep.measured == 2 * len(SHAPES) and rep.left == 0, rep
        assert not rep.errors, rep.errors
    # the pinned node measured only its own key's calls, and nothing of this machine's
    assert not set(report.keys[mine].nodes) & set(report.keys[theirs].nodes)
    assert len(report.keys[theirs].nodes) == 1
    devices = {r[2] for r in rows}
    assert len(devices) == 2 and any(d.endswith("|1 core") for d in devices)


@SLOW
def test_every_call_is_measured_once_per_hardware_key(cluster, shared_target, tmp_path):
    from tensor_graphs.profiler.ray_profile import profile_on_ray

    address, here, other = cluster
    db = _target(shared_target)
    report = profile_on_ray(address, db, _source(_graph(tmp_path)), ("cpu",), lease=LEASE,
                            progress=False)
    _check_once(db, report, here, other)
    # a second run finds nothing missing and measures nothing
    again = profile_on_ray(address, db, _source(_graph(tmp_path)), ("cpu",), lease=LEASE,
                           progress=False)
    assert all(r.calls == r.measured == 0 for r in again.keys.values())


@SLOW
def test_a_sigkilled_worker_loses_nothing_and_its_claims_are_taken_over(cluster, shared_target,
                                                                         tmp_path):
    from tensor_graphs.profiler.ray_profile import profile_on_ray

    address, here, other = cluster
    db = _target(shared_target)
    (mine,) = here
    killed: dict = {}

    def kill_the_first(window: dict) -> None:
        """SIGKILL the worker of this machine's kind that reports first, once: rows are
        recorded by then and its next window is being measured (a generator runs ahead)."""
        if killed or not window["rows"] or window["resource"] != mine:
            return
        owner = f":{window['pid']}:"
        with Database(db) as store:
            deadline = time.monotonic() + 10
            while not (held := [c for c in store.claims() if owner in c[3]]) \
                    and time.monotonic() < deadline:  # its next window, claimed
                time.sleep(0.005)
            os.kill(window["pid"], signal.SIGKILL)
        killed.update(held=held, committed=set(_rows(db)))

    start = time.monotonic()
    report = profile_on_ray(address, db, _source(_graph(tmp_path)), ("cpu",), lease=LEASE,
                            progress=False, on_window=kill_the_first)
    took = time.monotonic() - start
    assert killed, "no worker was killed"
    rep = report.keys[mine]
    assert rep.died == 1 and rep.replaced == 1
    rows = set(_rows(db))
    assert killed["committed"] <= rows  # every committed row kept, as it was
    assert len(killed["committed"]) >= 8
    _check_once(db, report, here, other)  # nothing measured twice, the run completed
    assert killed["held"], "the killed worker held no claim"
    when = {(k, s, d): t for k, s, d, _, t in rows}
    for kernel, sig, _, _, expires in killed["held"]:  # taken over once the lease ran out
        device = next(d for k, s, d, _, _ in rows if (k, s) == (kernel, sig)
                      and d.endswith("cores"))
        assert when[kernel, sig, device] >= expires
    assert took < 120


@SLOW
def test_no_node_of_the_kind_is_a_clear_error(cluster, tmp_path):
    from tensor_graphs.profiler.ray_profile import profile_on_ray

    address, _, _ = cluster
    db = str(tmp_path / "m.sqlite")
    with pytest.raises(ClusterError, match="advertises hardware for cuda.*tg ray-node"):
        profile_on_ray(address, db, _source(_graph(tmp_path)), ("cuda",), progress=False)


# --------------------------------------------------------------------- the command line
def _tg(capsys, *args: str) -> tuple[int, str, str]:
    from tensor_graphs.cli import main

    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_without_ray_the_error_names_the_extra(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    code, _, err = _tg(capsys, "profile", "block", "--ray", "127.0.0.1:6379", "--db",
                       str(tmp_path / "m.sqlite"))
    assert code == 1 and 'pip install -c constraints.txt "tensor_graphs[ray]"' in err, err
    code, _, err = _tg(capsys, "ray-node", "--head")
    assert code == 1 and "tensor_graphs[ray]" in err, err
    code, _, err = _tg(capsys, "profile", "block", "--ray", "auto", "--budget", "5")
    assert code == 2 and "--budget does not apply with --ray" in err, err


def test_an_address_nobody_answers_at_is_a_clear_error(capsys, tmp_path):
    pytest.importorskip("ray") if not RAY_REQUIRED else None
    import socket

    with socket.socket() as s:  # a port just free: nobody listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    code, _, err = _tg(capsys, "profile", "block", "--ray", f"127.0.0.1:{port}", "--db",
                       str(tmp_path / "m.sqlite"))
    assert code == 1 and f"no Ray cluster answers at 127.0.0.1:{port}" in err, err
    assert "tg ray-node --head" in err and time.monotonic() - start < 30
    code, _, err = _tg(capsys, "profile", "block", "--ray", "headnode", "--db",
                       str(tmp_path / "m.sqlite"))
    assert code == 1 and "'headnode' is not a Ray address: give HOST:PORT" in err, err


def test_ray_node_advertises_this_machines_hardware(capsys):
    from tensor_graphs.db.hardware import current
    from tensor_graphs.profiler.ray_profile import kind_of, node_resources, resource_name

    code, out, _ = _tg(capsys, "ray-node", "10.0.0.1:6379", "--dry-run")
    assert code == 0
    words = shlex.split(out)
    assert words[words.index("--address") + 1] == "10.0.0.1:6379"
    advertised = json.loads(words[words.index("--resources") + 1])
    assert advertised == node_resources()
    assert resource_name("cpu", current("cpu")) in advertised
    assert kind_of(resource_name("cpu", current("cpu"))) == "cpu" and kind_of("CPU") is None
    code, _, err = _tg(capsys, "ray-node")
    assert code == 2 and "give the head's ADDRESS" in err


@SLOW
def test_tg_profile_ray_end_to_end(cluster, capsys, tmp_path):
    """The command: a graph file's text shipped to the nodes, every backend, each node's
    device calibrated before it measures, one row per hardware key on -o json."""
    address, here, other = cluster
    path = tmp_path / "small.json"
    tg.save([tg.input("a", (4, 8)) * 2.0 + 1.0], path)
    db = str(tmp_path / "m.sqlite")
    code, out, err = _tg(capsys, "profile", str(path), "--ray", address, "--db", db, "-o",
                         "json")
    assert code == 0, err
    rows = {r["hardware"]: r for r in json.loads(out)}
    assert set(rows) == set(here) | set(other)
    for r in rows.values():
        assert r["calls"] == r["measured"] > 0 and r["left"] == 0 and not r["errors"]
    with Database(db) as store:
        assert store.stats()["calibrations"] == 2  # each hardware key's rates
        got = [(m.kernel, m.signature, m.hardware.device) for m in store.rows()]
    assert len(got) == len(set(got)) == sum(r["measured"] for r in rows.values())
