"""``tg profile --ray ADDRESS``: profiling spread over a Ray cluster, every machine measuring on
its own hardware and writing to the one shared database.

Rows are filed per hardware key (device and libs layers), so a row is only worth anything when
measured on the hardware it names: work for a key may only go to machines of that key. Each
node advertises its hardware as Ray resources, one unit per device kind it has, named from the
key (``resource_name``: ``tg_hw_cpu_<device key>``, ``tg_hw_cuda_<device key>``; ``tg
ray-node`` starts a node with them, ``node_resources`` lists them). The driver starts, per
resource of a device kind the graph plans for, as many measuring actors as the cluster has
units of it, each asking for one unit: Ray places an actor only on a node advertising that
resource, so a machine without the hardware is never asked, and one unit per node keeps two
measuring actors of one kind from sharing a machine (they would time each other's load).
An actor checks its own hardware against the resource it was placed by and refuses (measuring
nothing) when they differ.

1. What the database lacks is enumerated on the hardware itself: every actor plans the graph
   against the shared database (the planner comes from ``source``, a picklable callable the
   command layer provides) and lists the calls without a row under its key; the driver joins
   the lists of each key.
2. Every actor of a key gets that key's whole list and measures it through the claim protocol
   (``missing.Work``: a window of 8 claimed under a lease its owner renews; rows recorded one
   by one, each releasing its claim), so the actors split the work and each (kernel,
   signature, hardware) is recorded once. Each measured window streams back to the driver
   (a Ray generator), which draws the progress bar.
3. An actor that dies (its worker or its node killed) ends its stream with an error; its claims
   expire after one lease and are taken over by the actors of its key still running, and the
   driver starts a replacement (``REPLACEMENTS`` per key), which Ray places on any node with a
   free unit of that resource. Rows committed before the death are kept.

A database shared across machines is a ``postgresql://`` URL; a file works for nodes on one
machine (the tests' local cluster).
"""

from __future__ import annotations

import logging
import os
import socket
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from tensor_graphs import threads
from tensor_graphs.db.cost import measured_on
from tensor_graphs.db.hardware import Hardware, current
from tensor_graphs.db.store import Database, is_url, open_db
from tensor_graphs.devices import cuda_available
from tensor_graphs.errors import ClusterError
from tensor_graphs.planner.plan import COPY, KERNEL
from tensor_graphs.planner.search import Planner
from tensor_graphs.profiler import missing
from tensor_graphs.progress import Progress

PREFIX = "tg_hw_"  # a Ray resource naming a device kind and hardware key: tg_hw_<kind>_<key>
KINDS = ("cpu", "cuda")
REPLACEMENTS = 3  # actors started again per hardware key after one died
CONNECT_TIMEOUT = 5.0  # seconds for the head's port to answer before Ray is asked to connect
EXTRA = 'pip install -c constraints.txt "tensor_graphs[ray]"'

Key = tuple[str, str]  # (kernel name, signature): one call on one hardware key


def resource_name(kind: str, hardware: Hardware) -> str:
    """The Ray resource a node with ``hardware`` for kernels of ``kind`` advertises."""
    return f"{PREFIX}{kind}_{hardware.device_key}"


def kind_of(resource: str) -> str | None:
    """The device kind a resource of ``resource_name`` is for, else None."""
    if not resource.startswith(PREFIX):
        return None
    kind = resource[len(PREFIX):].split("_", 1)[0]
    return kind if kind in KINDS else None


def node_resources() -> dict[str, float]:
    """This machine's resources: one unit per device kind it can measure (the CPU, and a GPU
    when one is usable, the simulated one included)."""
    kinds = ["cpu"] + (["cuda"] if cuda_available() else [])
    return {resource_name(k, current(k)): 1.0 for k in kinds}


def import_ray():
    """The ``ray`` module, or a ClusterError naming the extra that installs it."""
    try:
        import ray
    except ImportError as exc:
        raise ClusterError(f"--ray needs Ray, which is not installed here ({exc}): {EXTRA} "
                           "on the driver and on every node") from exc
    return ray


def connect(ray, address: str) -> bool:
    """Join the cluster at ``address`` (HOST:PORT of its head, ``ray://HOST:PORT``, or
    "auto"); True when this call connected (and the caller disconnects). An address nobody
    answers at is refused at once: Ray itself retries for minutes."""
    if ray.is_initialized():
        return False
    if address != "auto":
        host, _, port = address.removeprefix("ray://").rpartition(":")
        if not host or not port.isdigit():
            raise ClusterError(f"--ray {address!r} is not a Ray address: give HOST:PORT of the "
                               "head node (as `ray start --head` or `tg ray-node --head` "
                               "prints it), ray://HOST:PORT, or auto")
        try:
            socket.create_connection((host.strip("[]"), int(port)), CONNECT_TIMEOUT).close()
        except OSError as exc:
            raise ClusterError(f"no Ray cluster answers at {address} "
                               f"({exc.strerror or type(exc).__name__}): start its head with "
                               "`tg ray-node --head` on that machine, or check the address "
                               "and the firewall") from exc
    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING,
                 namespace="tensor_graphs")
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ClusterError(f"cannot join the Ray cluster at {address}: {exc}") from exc
    return True


def _where() -> dict:
    """This worker's node (Ray's id), host and process, for reports and tests."""
    import ray

    return {"node": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(),
            "pid": os.getpid()}


class Measurer:
    """A measuring actor for one device kind on one node (made a Ray actor by the driver).
    ``source(db)`` plans the graph; ``prepare(db, planner)`` (optional) readies the node
    first (the command layer calibrates an uncalibrated device) and returns True when the
    planner must be made again."""

    def __init__(self, db: str, source: Callable[[Database], Planner], kind: str,
                 resource: str, lease: float | None = None,
                 prepare: Callable[[Database, Planner], bool] | None = None):
        self.target, self.source, self.kind, self.resource = db, source, kind, resource
        self.lease, self.prepare = lease, prepare
        self.db: Database | None = None
        self.planner: Planner | None = None
        # the actor holds its machine's unit of this kind: it measures with the machine's
        # thread count as `tg profile` would (TG_NUM_THREADS, else every core), not the one
        # thread Ray gives an actor without CPUs
        if "TG_NUM_THREADS" not in os.environ:
            threads.set_num_threads(threads.cores())

    def _plan(self) -> Planner:
        if self.planner is not None:
            return self.planner
        db = open_db(self.target)
        here = _where()["host"]
        if db.readonly:
            raise ClusterError(f"node {here}: the measurement database {db.path} is read-only "
                               f"there ({db.readonly_reason}); nothing it measured could be "
                               "kept")
        planner = self.source(db)
        hw = planner.cost.hardware.get(self.kind) or current(self.kind)
        if resource_name(self.kind, hw) != self.resource:
            raise ClusterError(
                f"node {here} advertises {self.resource} but its {self.kind} is "
                f"{hw.device!r} ({resource_name(self.kind, hw)}): it measured nothing; start "
                "its Ray node with `tg ray-node`, which advertises what the machine has")
        if self.prepare is not None and self.prepare(db, planner):
            planner = self.source(db)
        planner.plan()  # the search lists every option of every slot it visits
        self.db, self.planner = db, planner
        return planner

    def missing(self) -> tuple[Hardware, list[Key], dict]:
        """This key's hardware and the calls of this kind without a row, in the graph's
        order."""
        planner = self._plan()
        todo = [o for o in missing.calls_to_measure(planner)
                if measured_on(o.kernel) == self.kind]
        return (planner.cost.hardware.get(self.kind) or current(self.kind),
                [(o.kernel.name, o.signature) for o in todo], _where())

    def run(self, keys: Sequence[Key]) -> Iterator[dict]:
        """Measure ``keys`` split with the other actors of this key (claims); yields one
        report per window recorded ({"rows": [(kernel, signature, failure)], "pid", "node",
        "resource"}),
        then a last one with "by_others" (calls another profiler recorded) and "unknown"
        (calls this planner does not offer)."""
        planner = self._plan()
        index: dict[Key, object] = {}
        for options in planner._options.values():
            for o in options:
                if o.how in (KERNEL, COPY) and measured_on(o.kernel) == self.kind:
                    index.setdefault((o.kernel.name, o.signature), o)
        options = [index[tuple(k)] for k in keys if tuple(k) in index]
        where = {**_where(), "resource": self.resource}
        work = missing.Work(self.db, options, self.lease, hardware=planner.cost.hardware)
        for window in work:
            rows = []
            for o, m in window:
                self.db.record(m)
                rows.append((o.kernel.name, o.signature, m.failure))
            yield {**where, "rows": rows}
        yield {**where, "rows": [], "by_others": work.by_others,
               "unknown": len(keys) - len(options), "left": len(work.pending)}


@dataclass
class KeyReport:
    """What the run did for one hardware key (one Ray resource)."""

    resource: str
    device: str = ""
    actors: int = 0  # started at first
    calls: int = 0  # what the database lacked when the actors looked
    measured: int = 0  # rows the actors recorded in this run
    failures: int = 0  # of those, kernels that failed their check or raised
    by_others: int = 0  # calls recorded meanwhile by profilers outside this run
    left: int = 0  # calls still without a row at the end
    died: int = 0  # actors lost (worker or node killed)
    replaced: int = 0  # actors started again after one died
    nodes: Counter = field(default_factory=Counter)  # rows per node id
    errors: list[str] = field(default_factory=list)


@dataclass
class RayReport:
    """Per hardware key (resource name), what ``profile_on_ray`` did."""

    address: str
    keys: dict[str, KeyReport] = field(default_factory=dict)

    def rows(self) -> list[dict]:
        return [{"hardware": r.resource, "device": r.device, "nodes": len(r.nodes),
                 "calls": r.calls, "measured": r.measured, "failures": r.failures,
                 "by_others": r.by_others, "left": r.left, "died": r.died,
                 "errors": "; ".join(r.errors)} for r in self.keys.values()]

    def table(self) -> str:
        lines = [f"profiled on the Ray cluster at {self.address}:"]
        for r in self.keys.values():
            lines.append(f"  {r.resource} ({r.device or '?'}): {r.measured} of {r.calls} "
                         f"calls measured on {len(r.nodes)} node(s) by {r.actors} actor(s)"
                         f"{f', {r.failures} failed' if r.failures else ''}"
                         f"{f', {r.by_others} by other profilers' if r.by_others else ''}"
                         f"{f', {r.died} actor(s) died, {r.replaced} replaced' if r.died else ''}"
                         f"{f', {r.left} left without a row' if r.left else ''}")
            lines.extend(f"    {e}" for e in r.errors)
        return "\n".join(lines)


def _cause(exc: BaseException) -> str:
    """The message of the error an actor raised (Ray wraps it), on one line."""
    inner = getattr(exc, "cause", None) or exc
    text = str(inner).strip().splitlines()
    return f"{type(inner).__name__}: {text[-1] if text else ''}"[:300]


def profile_on_ray(address: str, db: str, source: Callable[[Database], Planner],
                   kinds: Sequence[str], *, lease: float | None = None,
                   prepare: Callable[[Database, Planner], bool] | None = None,
                   progress: bool = True,
                   on_window: Callable[[dict], None] | None = None) -> RayReport:
    """Measure what the database ``db`` (a ``postgresql://`` URL, or a file every node can
    open) lacks for the graph ``source`` plans, on the Ray cluster at ``address``, for the
    device ``kinds`` the plan may use (see the module doc). ``lease`` defaults to
    ``missing.LEASE_SECONDS``; ``on_window`` sees each window's report as it arrives."""
    ray = import_ray()
    if not is_url(db) and str(db) == ":memory:":
        raise ClusterError("--ray needs a database every node can reach: a postgresql:// URL "
                           "(or, for nodes on this machine, a file), not :memory:")
    if not is_url(db):
        db = os.path.abspath(os.path.expanduser(str(db)))
    connected = connect(ray, address)
    started: list = []
    try:
        return _run(ray, address, db, source, kinds, lease, prepare, progress, on_window,
                    started)
    finally:
        for actor in started:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - already dead
                pass
        if connected:
            ray.shutdown()


def _run(ray, address, db, source, kinds, lease, prepare, progress, on_window, started
         ) -> RayReport:
    from ray.exceptions import RayActorError, RayError

    report = RayReport(address)
    have = ray.cluster_resources()
    wanted = {r: int(n) for r, n in sorted(have.items()) if kind_of(r) in kinds and n >= 1}
    if not wanted:
        raise ClusterError(
            f"no node of the Ray cluster at {address} advertises hardware for "
            f"{'/'.join(kinds)} kernels (resources {PREFIX}<kind>_<key>): start each "
            f"machine's node with `tg ray-node {address}` (this machine would advertise "
            f"{', '.join(node_resources())})")
    remote = ray.remote(Measurer)

    def start(resource: str):
        actor = remote.options(resources={resource: 1}, num_cpus=0, max_restarts=0,
                               max_task_retries=0).remote(db, source, kind_of(resource),
                                                          resource, lease, prepare)
        started.append(actor)
        return actor

    lists: dict[str, dict[Key, None]] = {}
    hardware: dict[str, Hardware] = {}
    asked = {}
    for resource, count in wanted.items():
        report.keys[resource] = KeyReport(resource, actors=count)
        lists[resource] = {}
        for _ in range(count):
            actor = start(resource)
            asked[actor.missing.remote()] = (resource, actor)
    live: dict[str, list] = {r: [] for r in wanted}
    for ref, (resource, actor) in asked.items():  # 1. each key's list, made on its hardware
        rep = report.keys[resource]
        try:
            hw, keys, _ = ray.get(ref)
        except RayError as exc:
            rep.errors.append(_cause(exc))
            ray.kill(actor)
            continue
        hardware[resource], rep.device = hw, hw.device
        lists[resource].update(dict.fromkeys(map(tuple, keys)))
        live[resource].append(actor)
    for resource, rep in report.keys.items():
        rep.calls = len(lists[resource])
    bar = Progress(sum(len(v) for v in lists.values()), "measuring on Ray") if progress \
        else None
    streams = {}  # 2. every actor of a key measures its list, split by claims
    for resource, actors in live.items():
        for actor in actors:
            streams[actor.run.remote(list(lists[resource]))] = resource
    while streams:
        ready, _ = ray.wait(list(streams), num_returns=1)
        for stream in ready:
            resource = streams[stream]
            rep = report.keys[resource]
            try:
                out = ray.get(next(stream))
            except StopIteration:
                del streams[stream]
                continue
            except RayActorError as exc:  # 3. its claims expire; a replacement takes over
                del streams[stream]
                rep.died += 1
                if rep.replaced < REPLACEMENTS:
                    rep.replaced += 1
                    streams[start(resource).run.remote(list(lists[resource]))] = resource
                else:
                    rep.errors.append(f"{REPLACEMENTS} replacements died too: {_cause(exc)}")
                continue
            except RayError as exc:
                del streams[stream]
                rep.errors.append(_cause(exc))
                continue
            for kernel, _, failure in out["rows"]:
                rep.measured += 1
                rep.failures += failure is not None
                rep.nodes[out["node"]] += 1
                if bar is not None:
                    bar.step(kernel)
            if on_window is not None:
                on_window(out)
    if bar is not None:
        bar.close()
    _count_left(db, report, lists, hardware)
    return report


def _count_left(db: str, report: RayReport, lists: Mapping[str, Mapping[Key, None]],
                hardware: Mapping[str, Hardware]) -> None:
    """Each key's calls still without a row, read back from the database; what others
    recorded is what has a row but was not measured by this run's actors."""
    store = open_db(db)
    for resource, rep in report.keys.items():
        hw = hardware.get(resource)
        if hw is None:
            rep.left = rep.calls
            continue
        rep.left = sum(1 for k, s in lists[resource] if store.lookup(k, s, hw) is None)
        rep.by_others = max(rep.calls - rep.left - rep.measured, 0)


__all__ = ["ClusterError", "Measurer", "RayReport", "kind_of", "node_resources",
           "profile_on_ray", "resource_name"]
