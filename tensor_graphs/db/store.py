"""The measurement database: kernel timings on this hardware, in one SQLite file.

Only kernel measurements are stored (never graphs): a row is a hardware key (machine, device,
libs), a kernel name and the hash of its source, an input signature, and the timing and error
of that kernel on those inputs. Several processes may write at once (WAL and a busy timeout;
every ``record`` is its own committed transaction, so a killed writer loses nothing it
committed and leaves no lock), and profilers sharing a file split the work through ``claims``
(a lease its owner renews while alive, so a dead one's work is taken over). A file we did not
make, one that is not SQLite at all, or anything but a regular file (a FIFO would hang the
first read) is refused with a ``DatabaseError`` and never touched; a file or directory we may
not write is opened read-only, so planning still works, committed rows still in its WAL
included. ``db.revision`` changes with every write: the plan cache keys on it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import shutil
import sqlite3
import tempfile
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from tensor_graphs.db.hardware import Hardware, current
from tensor_graphs.db.schema import SCHEMA_VERSION, render
from tensor_graphs.errors import DatabaseError, UntrustedPathError
from tensor_graphs.files import (
    atomic_write,
    check_regular,
    open_regular,
    parse_json,
    private_dir,
)

APPLICATION_ID = 0x54474442  # "TGDB": marks a file as ours (PRAGMA application_id)
SQLITE_HEADER = b"SQLite format 3\x00"
BUSY_TIMEOUT_MS = 60_000

# MIGRATIONS[i] takes a file from user_version i to i + 1 (db/schema.py, shared with
# the PostgreSQL store)
MIGRATIONS: list[tuple[str, ...]] = render("sqlite")

_COLUMNS = ("machine", "device", "libs", "kernel", "source_hash", "signature", "runs",
            "median", "min", "max", "error", "failure", '"when"', "flops", "bytes")
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM measurements"
_FIELDS = ("kernel", "source_hash", "signature", "runs", "median", "min", "max", "error",
           "failure", "when", "machine", "device", "libs", "flops",
           "bytes")  # the JSON-lines record


def signature_text(inputs: Iterable[tuple[Sequence[int], Any]],
                   attrs: Mapping[str, Any] | None = None) -> str:
    """Canonical JSON for a kernel call: inputs as ([shape], dtype name), attrs with sorted
    keys, tuples as lists, floats by exact repr; equal calls give byte-equal text."""
    ins = [[[int(d) for d in shape], dtype if isinstance(dtype, str)
            else getattr(dtype, "name", str(dtype))] for shape, dtype in inputs]
    return json.dumps({"attrs": _jsonable(dict(attrs or {})), "inputs": ins},
                      sort_keys=True, separators=(",", ":"))


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return _jsonable(value.item())
    name = getattr(value, "name", None)
    return name if isinstance(name, str) else str(value)  # dtypes by name; sympy by str


@dataclass(frozen=True)
class Measurement:
    """One kernel timed on one input signature (seconds). A kernel that raised while being
    profiled has ``failure`` set and NaN timings. ``hardware=None`` means this machine's CPU
    key at record time; ``when=0`` means now."""

    kernel: str
    source_hash: str
    signature: str
    runs: int
    median: float
    min: float
    max: float
    error: float | None
    failure: str | None = None
    hardware: Hardware | None = None
    when: float = 0.0
    flops: float | None = None  # the call's work, for interpolating other shapes
    bytes: float | None = None

    @property
    def ok(self) -> bool:
        """True for a successful measurement (not a recorded failure)."""
        return self.failure is None

    @property
    def seconds(self) -> float:
        """The figure the cost model plans with: the fastest sample. On a shared machine other
        work only ever adds time (timeit's rationale for its minimum), and a slot's
        alternatives are sampled in the same rounds, so their fastest samples compare like
        with like; a median of five moved 50 % when a burst of load hit three rounds."""
        return self.min


def _nan_to_none(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else float(x)


def _none_to_nan(x: float | None) -> float:
    return math.nan if x is None else x


def _optional(x) -> float | None:
    return None if x is None else float(x)


def _from_row(row: Sequence) -> Measurement:
    machine, device, libs, kernel, shash, sig, runs, med, lo, hi, err, fail, when, fl, by = row
    return Measurement(kernel, shash, sig, runs, _none_to_nan(med), _none_to_nan(lo),
                       _none_to_nan(hi), err, fail, Hardware(machine, device, libs), when,
                       fl, by)


_instances = itertools.count()


class Database:
    """A measurement database at ``path`` (a file path or ":memory:"); see the module doc. A
    ``postgresql://`` URL gives the PostgreSQL store (db/postgres.py), never a file."""

    def __new__(cls, path: str | os.PathLike = ":memory:"):
        if cls is Database and is_url(path):
            from tensor_graphs.db.postgres import PostgresDatabase

            return super().__new__(PostgresDatabase)
        return super().__new__(cls)

    def __init__(self, path: str | os.PathLike = ":memory:"):
        self.path = str(path)
        # names this object for caches: id() may be reused once an in-memory database is freed
        self.instance = next(_instances)
        # what layers above derive from this database (the compiler's cost model): kept here,
        # it is freed with the database, where a table of their own would keep it alive
        self.derived: dict[str, object] = {}
        self.readonly = False
        self.readonly_reason: str | None = None
        self.open_mode = "memory"  # "rw", "ro", "immutable", or "memory" (also private copies)
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        if self.path == ":memory:":
            self._conn = _connect(":memory:")
            self._migrate()
        else:
            self._open_file(Path(os.path.expanduser(self.path)))

    # ------------------------------------------------------------------ opening
    def _open_file(self, p: Path) -> None:
        if is_cache_default(p):
            _check_default_folder(p.parent)
        _check_header(p)
        reason = _not_writable(p)
        if reason is None:
            try:
                self._conn = _connect(str(p))
                self._validate(p)
                self._enable_wal()
                self._migrate()
                self.open_mode = "rw"
                return
            except sqlite3.OperationalError as exc:  # a read-only mount os.access missed
                if "readonly" not in str(exc) and "unable to open" not in str(exc):
                    raise DatabaseError(f"cannot open the measurement database {p}: {exc}; "
                                        "check the file or use another one (TG_DB=path or "
                                        "db=...)") from exc
                self.close()
                reason = f"SQLite could not write it ({exc})"
            except sqlite3.DatabaseError as exc:
                self.close()
                raise _corrupt(p, exc) from exc
        self.readonly, self.readonly_reason = True, reason
        if not p.exists():  # nothing to read, nowhere to write: plan without measurements
            self._conn = _connect(":memory:")
            self._migrate()
            return
        try:
            self._conn, self.open_mode = _connect_readonly(p)
            version = self._validate(p)
            if version < SCHEMA_VERSION:  # migrate a private in-memory copy
                self._conn, self.open_mode = _into_memory(self._conn), "memory"
                self._migrate()
        except sqlite3.DatabaseError as exc:
            self.close()
            raise _corrupt(p, exc) from exc

    def _validate(self, p: Path) -> int:
        """Raise unless the file is ours (or empty); return its schema version. Reads only."""
        conn = self._conn
        conn.execute("BEGIN")  # one snapshot: another process may be initialising the file
        try:
            app = conn.execute("PRAGMA application_id").fetchone()[0]
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = [r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        finally:
            conn.execute("COMMIT")
        if app != APPLICATION_ID and (app != 0 or tables or version != 0):
            self.close()
            listed = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")
            raise DatabaseError(
                f"{p} is an SQLite database of another application (application_id {app}, "
                f"tables: {listed or 'none'}), not a tensor_graphs measurement database; it "
                "was left untouched. Point TG_DB or db= at another file.")
        if version > SCHEMA_VERSION:
            self.close()
            raise DatabaseError(
                f"{p} was written by a newer tensor_graphs (schema version {version}; this "
                f"version reads up to {SCHEMA_VERSION}); it was left untouched. Upgrade "
                "tensor_graphs or point TG_DB or db= at another file.")
        return version

    def _enable_wal(self) -> None:
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        while True:  # changing the journal mode needs a moment with no other connection
            try:
                self._conn.execute("PRAGMA journal_mode=WAL").fetchone()
                break  # (a file system without WAL support keeps its old mode: fine)
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc) \
                        or time.monotonic() > deadline:
                    raise
            time.sleep(0.01)
        self._conn.execute("PRAGMA synchronous=NORMAL")  # WAL: durable across process kills

    def _migrate(self) -> None:
        conn = self._conn
        if conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
            return
        conn.execute("BEGIN IMMEDIATE")  # re-read: another process may have migrated it
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            for step in MIGRATIONS[version:]:
                for statement in step:
                    conn.execute(statement)
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    # ------------------------------------------------------------------ plumbing
    @property
    def closed(self) -> bool:
        return self._conn is None

    def close(self) -> None:
        """Close the connection (the last writer's close also checkpoints the WAL file)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Database({self.path!r}{', readonly' if self.readonly else ''})"

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._conn is None:
                raise DatabaseError(f"the measurement database {self.path} is closed")
            try:
                yield self._conn
            except sqlite3.DatabaseError as exc:
                raise DatabaseError(f"reading the measurement database {self.path} failed: "
                                    f"{exc}") from exc

    @contextmanager
    def _write(self, revise: bool = True) -> Iterator[sqlite3.Connection]:
        """One committed transaction; the revision goes up when it changed any row (unless
        ``revise`` is False: claims change no estimate, so they keep cached plans valid)."""
        if self.readonly:
            raise DatabaseError(
                f"the measurement database {self.path} is read-only ({self.readonly_reason}), "
                "so nothing can be recorded; point TG_DB or db= at a writable file (check "
                "db.readonly first to plan without recording)")
        with self._read() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                before = conn.total_changes
                yield conn
                if revise and conn.total_changes != before:
                    conn.execute("UPDATE meta SET value = value + 1 WHERE key = 'revision'")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    def record_in_memory(self) -> bool:
        """Let a read-only database take records, for this process only: its rows are copied
        into a private in-memory database that later reads and records use, so what this
        process measures still informs its plans; they are lost when it exits. Warns once,
        naming the file and why it is read-only. False when the database was writable."""
        with self._lock:
            if not self.readonly or self._conn is None:
                return False
            if self.open_mode != "memory":
                self._conn, self.open_mode = _into_memory(self._conn), "memory"
            self.readonly = False
        warnings.warn(
            f"the measurement database {self.path} is read-only ({self.readonly_reason}): what "
            "this process measures is kept in memory and lost when it exits. Point TG_DB or "
            "db= at a writable file to keep the measurements.", RuntimeWarning, stacklevel=2)
        return True

    # ------------------------------------------------------------------ writing
    def record(self, m: Measurement) -> Measurement:
        """Store one measurement in its own transaction; returns it with hardware and when."""
        m = _complete(m)
        with self._write() as conn:
            _insert(conn, m)
        return m

    def record_many(self, ms: Iterable[Measurement]) -> int:
        """Store several measurements in one transaction; returns how many."""
        rows = [_complete(m) for m in ms]
        if not rows:
            return 0
        with self._write() as conn:
            for m in rows:
                _insert(conn, m)
        return len(rows)

    def set_calibration(self, hardware: Hardware | None, rates: Mapping[str, float]) -> None:
        """Store the device's measured peak rates (replacing earlier ones)."""
        hw = hardware or current()
        with self._write() as conn:
            conn.execute('INSERT OR REPLACE INTO calibration (device, libs, rates, "when") '
                         "VALUES (?, ?, ?, ?)",
                         (hw.device, hw.libs, json.dumps(dict(rates), sort_keys=True),
                          time.time()))

    # ------------------------------------------------------------------ claims
    def claim(self, work: Sequence[tuple[str, str, str]], owner: str, lease: float,
              limit: int | None = None, hardware: Hardware | None = None) -> list[str]:
        """Claim work items (kernel, source_hash, signature) to measure on ``hardware``'s
        device and libs for ``owner``, for ``lease`` seconds, in order until ``limit`` are
        claimed. Per item: "claimed"; "done" (a row of it exists); "held" (another owner's
        lease has not expired: that owner is alive and renewing it, see ``renew``); "later"
        (past the limit, not looked at). One write transaction (BEGIN IMMEDIATE), so two
        profilers never both claim an item; an expired lease is taken over, so work is never
        left to a dead profiler. ``record`` releases the claim of the row it stores."""
        hw = hardware or current()
        now = time.time()
        states: list[str] = []
        taken = 0
        with self._write(revise=False) as conn:
            for kernel, shash, sig in work:
                if limit is not None and taken >= limit:
                    states.append("later")
                    continue
                key = (kernel, shash, sig, hw.device, hw.libs)
                if conn.execute("SELECT 1 FROM measurements WHERE kernel = ? AND "
                                "source_hash = ? AND signature = ? AND device = ? AND "
                                "libs = ? LIMIT 1", key).fetchone():
                    states.append("done")
                    continue
                held = conn.execute(f"SELECT owner, expires FROM claims WHERE {_CLAIM_KEY}",
                                    key).fetchone()
                if held is not None and held[0] != owner and held[1] > now:
                    states.append("held")
                    continue
                conn.execute("INSERT OR REPLACE INTO claims (kernel, source_hash, signature, "
                             "device, libs, owner, expires) VALUES (?, ?, ?, ?, ?, ?, ?)",
                             (*key, owner, now + lease))
                states.append("claimed")
                taken += 1
        return states

    def renew(self, owner: str, lease: float) -> int:
        """Extend every claim of ``owner`` to ``lease`` seconds from now; returns how many."""
        with self._write(revise=False) as conn:
            return conn.execute("UPDATE claims SET expires = ? WHERE owner = ?",
                                (time.time() + lease, owner)).rowcount

    def release(self, owner: str) -> int:
        """Drop every claim of ``owner`` (work it will not record); returns how many."""
        with self._write(revise=False) as conn:
            return conn.execute("DELETE FROM claims WHERE owner = ?", (owner,)).rowcount

    def claims(self) -> list[tuple[str, str, str, str, float]]:
        """The claims held now: (kernel, signature, hardware key, owner, expires)."""
        with self._read() as conn:
            return [(k, sig, Hardware("", d, li).device_key, owner, expires)
                    for k, sig, d, li, owner, expires in conn.execute(
                        "SELECT kernel, signature, device, libs, owner, expires FROM claims "
                        "ORDER BY expires")]

    # ------------------------------------------------------------------ reading
    @property
    def revision(self) -> int:
        """A counter every write increments (part of the plan cache key)."""
        with self._read() as conn:
            return conn.execute("SELECT value FROM meta WHERE key = 'revision'").fetchone()[0]

    def lookup(self, kernel: str, signature: str, hardware: Hardware | None = None,
               source_hash: str | None = None) -> Measurement | None:
        """The most recent row for kernel + signature on the same device and libs (failures
        included: check ``.ok``), preferring rows of ``source_hash`` if given, then rows of
        this machine. The caller decides staleness by comparing ``source_hash``."""
        hw = hardware or current()
        with self._read() as conn:
            row = conn.execute(
                f"{_SELECT} WHERE kernel = ? AND device = ? AND libs = ? AND signature = ? "
                'ORDER BY source_hash = ? DESC, machine = ? DESC, "when" DESC, id DESC '
                "LIMIT 1", (kernel, hw.device, hw.libs, signature, source_hash or "",
                            hw.machine)).fetchone()
        return None if row is None else _from_row(row)

    def rows_for(self, kernel: str, hardware: Hardware | None = None) -> list[Measurement]:
        """Every successful row of ``kernel`` on the same device and libs (any machine, any
        source hash), oldest first: the points the cost model interpolates between."""
        hw = hardware or current()
        with self._read() as conn:
            rows = conn.execute(
                f"{_SELECT} WHERE kernel = ? AND device = ? AND libs = ? AND failure IS NULL "
                'ORDER BY "when", id', (kernel, hw.device, hw.libs)).fetchall()
        return [_from_row(r) for r in rows]

    def rows_named(self, prefix: str, hardware: Hardware | None = None) -> list[Measurement]:
        """``rows_for`` of every kernel whose name starts with ``prefix``: the kernels of one
        generator (named ``prefix`` + a hash), which calibrate the estimates of those it has
        not measured (``db/generated_cost.py``). A range on the indexed name, not a LIKE."""
        hw = hardware or current()
        with self._read() as conn:
            rows = conn.execute(
                f"{_SELECT} WHERE kernel >= ? AND kernel < ? AND device = ? AND libs = ? "
                'AND failure IS NULL ORDER BY "when", id',
                (prefix, prefix + "\U0010ffff", hw.device, hw.libs)).fetchall()
        return [_from_row(r) for r in rows]

    def calibration(self, hardware: Hardware | None = None) -> dict | None:
        """The peak rates stored for this device and libs, or None before calibration."""
        hw = hardware or current()
        with self._read() as conn:
            row = conn.execute("SELECT rates FROM calibration WHERE device = ? AND libs = ?",
                               (hw.device, hw.libs)).fetchone()
        return None if row is None else json.loads(row[0])

    def rows(self, kernel: str | None = None, limit: int | None = None) -> list[Measurement]:
        """Rows (of one kernel, if given), most recent first."""
        where, args = ("WHERE kernel = ?", [kernel]) if kernel else ("", [])
        sql = f'{_SELECT} {where} ORDER BY "when" DESC, id DESC'
        if limit is not None:
            sql, args = sql + " LIMIT ?", [*args, int(limit)]
        with self._read() as conn:
            return [_from_row(r) for r in conn.execute(sql, args)]

    def stats(self, current_hashes: Mapping[str, str] | None = None) -> dict:
        """Counts: rows, kernels, failures, per-hardware rows, calibrations, revision, and
        (given {kernel: current source_hash}) how many rows are stale."""
        with self._read() as conn:
            rows, kernels, failures = conn.execute(
                "SELECT count(*), count(DISTINCT kernel), count(failure) "
                "FROM measurements").fetchone()
            hardware = [{"key": Hardware(m, d, li).key, "machine": m, "device": d, "libs": li,
                         "rows": n} for m, d, li, n in conn.execute(
                "SELECT machine, device, libs, count(*) FROM measurements "
                "GROUP BY machine, device, libs ORDER BY count(*) DESC")]
            calibrations = conn.execute("SELECT count(*) FROM calibration").fetchone()[0]
            span = conn.execute('SELECT min("when"), max("when") FROM measurements').fetchone()
        out = {"path": self.path, "readonly": self.readonly, "schema": SCHEMA_VERSION,
               "revision": self.revision, "rows": rows, "kernels": kernels,
               "failures": failures, "hardware": hardware, "calibrations": calibrations,
               "oldest": span[0], "newest": span[1]}
        if current_hashes is not None:
            out["stale"] = sum(n for _, _, n in self._stale(current_hashes))
        return out

    def _stale(self, current_hashes: Mapping[str, str]) -> list[tuple[str, str, int]]:
        with self._read() as conn:
            groups = conn.execute("SELECT kernel, source_hash, count(*) FROM measurements "
                                  "GROUP BY kernel, source_hash").fetchall()
        return [(k, h, n) for k, h, n in groups
                if k in current_hashes and current_hashes[k] != h]

    # ------------------------------------------------------------------ maintenance
    def prune(self, stale_hashes: Mapping[str, str] | None = None,
              older_than: float | None = None, failures: bool = False) -> int:
        """Delete rows whose kernel's source changed (``stale_hashes`` = {kernel: current
        hash}), rows older than ``older_than`` seconds, and/or failures; returns how many."""
        stale = self._stale(stale_hashes) if stale_hashes else []
        if not stale and older_than is None and not failures:
            return 0
        deleted = 0
        with self._write() as conn:
            for kernel, shash, _ in stale:
                deleted += conn.execute("DELETE FROM measurements WHERE kernel = ? AND "
                                        "source_hash = ?", (kernel, shash)).rowcount
            if older_than is not None:
                deleted += conn.execute('DELETE FROM measurements WHERE "when" < ?',
                                        (time.time() - older_than,)).rowcount
            if failures:
                deleted += conn.execute("DELETE FROM measurements WHERE failure IS NOT NULL"
                                        ).rowcount
        return deleted

    def export_jsonl(self, path_or_file: str | os.PathLike | IO[str]) -> int:
        """Write every row as one JSON object per line (NaN as null); returns the count."""
        with _text_file(path_or_file, "w") as f:
            n = 0
            for m in reversed(self.rows()):
                record = {k: getattr(m, k, None) for k in _FIELDS}
                record.update(machine=m.hardware.machine, device=m.hardware.device,
                              libs=m.hardware.libs)
                for k in ("median", "min", "max", "error"):
                    record[k] = _nan_to_none(record[k])
                f.write(json.dumps(record, sort_keys=True) + "\n")
                n += 1
        return n

    def import_jsonl(self, path_or_file: str | os.PathLike | IO[str]) -> int:
        """Merge rows written by ``export_jsonl``, skipping exact duplicates; returns how many
        rows were new."""
        where = f"{path_or_file}, " if isinstance(path_or_file, (str, os.PathLike)) else ""
        with _text_file(path_or_file, "rb") as f:  # a path: bytes, decoded line by line
            incoming = [_parse_line(line, number, where) for number, line in _lines(f, where)
                        if line.strip()]
        if not incoming:
            return 0
        added = 0
        cond = " AND ".join(f"{c} IS ?" for c in _COLUMNS)
        with self._write() as conn:
            for m in incoming:
                if conn.execute(f"SELECT 1 FROM measurements WHERE {cond} LIMIT 1",
                                _values(m)).fetchone() is None:
                    _insert(conn, m)
                    added += 1
        return added


def _complete(m: Measurement) -> Measurement:
    if not isinstance(m, Measurement):
        raise DatabaseError(f"record() takes a Measurement, got {type(m).__name__}")
    return replace(m, hardware=m.hardware or current(), when=m.when or time.time())


def _values(m: Measurement) -> tuple:
    hw = m.hardware
    return (hw.machine, hw.device, hw.libs, m.kernel, m.source_hash, m.signature, int(m.runs),
            _nan_to_none(m.median), _nan_to_none(m.min), _nan_to_none(m.max),
            _nan_to_none(m.error), m.failure, float(m.when), _nan_to_none(m.flops),
            _nan_to_none(m.bytes))


_CLAIM_KEY = "kernel = ? AND source_hash = ? AND signature = ? AND device = ? AND libs = ?"


def _insert(conn: sqlite3.Connection, m: Measurement) -> None:
    """Store a row and release the claim on it (whoever held it: the work is done)."""
    conn.execute(f"INSERT INTO measurements ({', '.join(_COLUMNS)}) VALUES "
                 f"({', '.join('?' * len(_COLUMNS))})", _values(m))
    conn.execute(f"DELETE FROM claims WHERE {_CLAIM_KEY}",
                 (m.kernel, m.source_hash, m.signature, m.hardware.device, m.hardware.libs))


# what a line of `tg db import` must be, and where such lines come from (for its errors)
_MEASUREMENT = "tensor_graphs measurement"
_EXPORTED = "expected the JSON lines `tg db export` writes"


def _lines(f, where: str) -> Iterator[tuple[int, bytes | str]]:
    """(number, line) of each line of ``f``: bytes from a path (``parse_json`` decodes them,
    naming the line), text from a stream, which fails as it reads a line that is not UTF-8."""
    number = 0
    try:
        for number, line in enumerate(f, 1):
            yield number, line
    except UnicodeDecodeError as exc:
        raise DatabaseError(f"{where}line {number + 1} is not a {_MEASUREMENT}: it is not UTF-8 "
                            f"text ({exc.reason} at byte {exc.start}); {_EXPORTED}") from exc


# the latest time a row may carry: the end of year 9999, which every platform's time_t and
# time.localtime take (an imported "when": 1e300 was stored, then `tg db show` and `tg db
# stats` failed on every later run with an internal OverflowError dating it)
LATEST_WHEN = 253402300799.0


def _runs(value) -> int:
    """An imported row's ``runs``: a whole number that a 64-bit INTEGER column holds (a
    larger one failed the import with an internal OverflowError from sqlite3; ``true`` and
    5.7 were taken as 1 and 5)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or value != int(value) or not 0 <= value < 2 ** 63:
        raise ValueError(f"runs is {str(value)[:40]}, not a whole number of 0 or more")
    return int(value)


def _when(value) -> float:
    """An imported row's ``when``: seconds since 1970, up to ``LATEST_WHEN``."""
    when = float(value)
    if not 0 <= when <= LATEST_WHEN:
        raise ValueError(f"when is {str(value)[:40]}, not a time in seconds since 1970 up to "
                         "the year 9999")
    return when


def _parse_line(line: bytes | str, number: int, where: str = "") -> Measurement:
    d = parse_json(line, f"{where}line {number}", _MEASUREMENT, _EXPORTED, DatabaseError)
    try:
        if not isinstance(d.get("failure"), (str, type(None))):
            raise TypeError(f"failure is {type(d['failure']).__name__}, not text")
        hw = Hardware(str(d["machine"]), str(d["device"]), str(d["libs"]))
        nums = {k: _none_to_nan(None if d.get(k) is None else float(d[k]))
                for k in ("median", "min", "max")}
        return Measurement(str(d["kernel"]), str(d["source_hash"]), str(d["signature"]),
                           _runs(d["runs"]), error=None if d.get("error") is None
                           else float(d["error"]), failure=d.get("failure"), hardware=hw,
                           when=_when(d["when"]), flops=_optional(d.get("flops")),
                           bytes=_optional(d.get("bytes")), **nums)
    # what JSON that is not a measurement raises: keys missing or of the wrong type (a list,
    # a string), numbers too large for a float
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as exc:
        raise DatabaseError(f"{where}line {number} is not a {_MEASUREMENT} "
                            f"({type(exc).__name__}: {str(exc)[:200]}); {_EXPORTED}") from exc


@contextmanager
def _text_file(target, mode: str) -> Iterator[IO]:
    """``target`` as given when it is a stream; a path opened "rb" to be parsed (a regular
    file only, ``files.open_regular``: a FIFO would hang the import) or "w" to be written as
    UTF-8. A path that cannot be opened raises ``DatabaseError`` naming it."""
    if not isinstance(target, (str, os.PathLike)):
        yield target
        return
    if mode == "rb":
        with open_regular(target, "file of measurements", "give a file `tg db export` wrote",
                          DatabaseError) as f:
            yield f
        return
    _refuse_a_database(target)
    # written aside and renamed: a failed export (the database unreadable, say) leaves the
    # file as it was; it once emptied the file first, the database itself when named
    with atomic_write(target, "w", what="file of measurements", error=DatabaseError) as f:
        yield f


def _refuse_a_database(target) -> None:
    """Refuse to write JSON lines over an SQLite database (a measurement database: this one,
    named by mistake, or another whose rows would be lost). Only a regular file is read: a
    FIFO's open() waited for a writer forever (atomic_write refuses it, naming it)."""
    try:
        with open_regular(target, "file of measurements", "", DatabaseError) as f:
            head = f.read(len(SQLITE_HEADER))
    except (OSError, DatabaseError):
        return  # no such file (or none to read): atomic_write says what is wrong
    if head == SQLITE_HEADER:
        raise DatabaseError(f"{target} is an SQLite database; `tg db export` writes JSON lines "
                            "and would replace it: give a new file name (rows.jsonl), or "
                            "merge rows into that database with `tg db import --db "
                            f"{target} FILE`")


def _connect(target: str, uri: bool = False) -> sqlite3.Connection:
    conn = sqlite3.connect(target, uri=uri, isolation_level=None, check_same_thread=False,
                           timeout=BUSY_TIMEOUT_MS / 1000)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    return conn


def _connect_readonly(p: Path) -> tuple[sqlite3.Connection, str]:
    """mode=ro first: it reads the WAL through an existing -shm file. Without one, in a folder
    we cannot write, SQLite cannot map the WAL: immutable=1 opens the main file alone, and
    rows committed to the WAL but not yet checkpointed (7 of 10, say, after a writer was
    killed) would be silently missing. So a non-empty WAL is read from a private copy of the
    file and its WAL; immutable=1 only when there is no WAL, or (with a warning naming the
    file) when the copy fails."""
    uri = p.absolute().as_uri()
    error: Exception | None = None
    try:
        return _try_connect(f"{uri}?mode=ro"), "ro"
    except sqlite3.OperationalError as exc:
        error = exc
    wal = Path(f"{p}-wal")
    if wal.exists() and wal.stat().st_size > 0:
        try:
            return _copy_with_wal(p), "memory"
        except (OSError, sqlite3.Error) as exc:
            warnings.warn(
                f"the measurement database {p} is read-only and its write-ahead log {wal} "
                f"could not be read ({exc}): rows committed to the log are missing until a "
                "process that may write the folder opens it (any tg command does).",
                RuntimeWarning, stacklevel=4)
    try:
        return _try_connect(f"{uri}?immutable=1"), "immutable"
    except sqlite3.OperationalError as exc:
        raise sqlite3.OperationalError(f"cannot open read-only: {error}; {exc}") from exc


def _try_connect(uri: str) -> sqlite3.Connection:
    conn = _connect(uri, uri=True)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error:
        conn.close()
        raise
    return conn


def _copy_with_wal(p: Path) -> sqlite3.Connection:
    """An in-memory database holding ``p`` with its WAL applied: both files copied into a
    private temporary folder (retried while a writer changes them, since a copy of the file
    and of a WAL from another checkpoint would not fit together), opened there, which
    replays the WAL, and copied into memory."""
    wal = Path(f"{p}-wal")
    with tempfile.TemporaryDirectory(prefix="tg-db-") as folder:  # mode 0700
        copy = Path(folder) / "copy.sqlite"
        for _ in range(5):
            before = [(os.stat(f).st_mtime_ns, os.stat(f).st_size) for f in (p, wal)]
            shutil.copyfile(p, copy)
            shutil.copyfile(wal, f"{copy}-wal")
            if [(os.stat(f).st_mtime_ns, os.stat(f).st_size) for f in (p, wal)] == before:
                break
        else:
            raise OSError(f"{p} kept changing while it was copied")
        return _into_memory(_connect(str(copy)))


def _into_memory(conn: sqlite3.Connection) -> sqlite3.Connection:
    """A private in-memory copy of ``conn``'s database, which takes writes the file may not;
    ``conn`` is closed."""
    try:
        mem = _connect(":memory:")
        conn.backup(mem)
        return mem
    finally:
        conn.close()


def _not_writable(p: Path) -> str | None:
    """Why we may not write the file (or create it), or None when we may."""
    parent = p.parent
    if not p.exists():
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return f"cannot create its directory: {exc.strerror}"
    reasons = []
    if p.exists() and not os.access(p, os.W_OK):
        reasons.append("the file is not writable")
    if not os.access(parent, os.W_OK):
        reasons.append(f"its directory {parent} is not writable")
    return "; ".join(reasons) or None


# the fix for a database path that is not a regular file
_NOT_A_DATABASE = "point TG_DB or db= at a database file (this one was left untouched)"


def _check_header(p: Path) -> None:
    """Refuse anything but a regular file (reading a FIFO blocks until someone writes it, so
    `tg db stats` hung; a device is no database), its WAL and shared-memory files included,
    and a file without SQLite's header (``files.open_regular``: judged by what was opened,
    never waited on). A missing file is fine: it is created fresh."""
    for sibling in (f"{p}-wal", f"{p}-shm", f"{p}-journal"):
        with contextlib.suppress(OSError):
            check_regular(sibling, os.stat(sibling).st_mode, _NOT_A_DATABASE, DatabaseError)
    try:
        os.stat(p)
    except FileNotFoundError:
        return
    except OSError:
        pass  # open_regular says why it cannot be opened
    with open_regular(p, "measurement database", _NOT_A_DATABASE, DatabaseError) as f:
        try:
            head = f.read(len(SQLITE_HEADER))
        except OSError as exc:
            raise DatabaseError(f"cannot read the measurement database {p}: {exc.strerror}") \
                from exc
    if head and head != SQLITE_HEADER:
        raise _corrupt(p, "no SQLite header")


def _corrupt(p: Path, why) -> DatabaseError:
    return DatabaseError(
        f"{p} is not a tensor_graphs measurement database ({why}): it is corrupt or another "
        "kind of file, and was left untouched. Move it away or point TG_DB or db= at another "
        "path; a missing file is created fresh.")


# --------------------------------------------------------------------------- open_db
_opened: dict[tuple[str, int], Database] = {}
_opened_lock = threading.Lock()


URL_SCHEMES = ("postgresql://", "postgres://")  # a server's database, never a file path


def is_url(target: object) -> bool:
    """True for a PostgreSQL URL (``Path`` would fold its ``//`` into a file name)."""
    return isinstance(target, str) and target.startswith(URL_SCHEMES)


def default_target() -> str | Path:
    """``$TG_DB`` (a file path or a ``postgresql://`` URL), else the default file."""
    env = os.environ.get("TG_DB")
    if env and is_url(env):
        return env
    return default_path()


def default_path() -> Path:
    """``$TG_DB``, else ``<user cache dir>/tensor_graphs/measurements.sqlite``."""
    if os.environ.get("TG_DB"):
        return Path(os.path.expanduser(os.environ["TG_DB"]))
    return _cache_default()


def _cache_default() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "tensor_graphs" / "measurements.sqlite"


def is_cache_default(p: str | os.PathLike) -> bool:
    """True for the default file in the user cache directory (``~`` expanded), whose folder
    opening it makes private: tg's --db takes it where it refuses other missing folders."""
    return os.path.abspath(os.path.expanduser(p)) == os.path.abspath(_cache_default())


def _check_default_folder(folder: Path) -> None:
    """The default folder is created private (0700) and refused when another user could write
    it: its rows decide which kernels run, and a planted row could make a plan pick a kernel
    outside the tolerance. (A TG_DB or db= path the user names is their choice.) A folder
    that cannot be created is left to ``_not_writable``: planning goes on without rows."""
    try:
        private_dir(folder)
    except UntrustedPathError:
        raise
    except OSError:
        pass


def open_db(db: Database | str | os.PathLike | None = None) -> Database:
    """A Database passes through; a path opens it (once per process); ":memory:" is always a
    new database; None opens ``$TG_DB`` or the default file in the user cache directory; a
    ``postgresql://`` URL opens that server's database (once per process, as a file)."""
    if isinstance(db, Database):
        return db
    if db is None:
        db = default_target()
    if str(db) == ":memory:":
        return Database(":memory:")
    where = db if is_url(db) else os.path.realpath(os.path.expanduser(str(db)))
    key = (where, os.getpid())  # never across fork
    with _opened_lock:
        found = _opened.get(key)
        if found is None or found.closed:
            found = _opened[key] = Database(db)
        return found


__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "Database", "Measurement", "default_path",
           "default_target", "is_cache_default", "is_url", "open_db", "signature_text"]
