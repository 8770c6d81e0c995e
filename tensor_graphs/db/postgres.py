"""The measurement database on a PostgreSQL server, for a team: every machine points ``TG_DB``
(or ``db=``) at one ``postgresql://`` URL and its rows, keyed by hardware as in the SQLite
file, inform every machine of the same kind.

The interface and the schema are the SQLite store's (``store.Database``, ``schema.VERSIONS``
rendered for PostgreSQL), so nothing above the database knows which store it has. What the
server changes: connections come from a pool and may drop (a restart, a failover, an
administrator ending a backend), and concurrent writers meet in the server rather than on one
file lock. So every transaction is retried on a dropped connection, a serialization failure
or a deadlock, and a retry can never double a row: measurements are inserted with ``ON
CONFLICT DO NOTHING`` on their natural key (hardware, kernel, source hash, signature, when),
so a batch whose COMMIT was sent just before the connection dropped adds nothing when resent.
Claims and the records that release them take a transaction-level advisory lock per hardware
key, which orders them as SQLite's ``BEGIN IMMEDIATE`` does: no item is claimed twice nor
measured again after it was recorded.

A role that may only read (a team's read-only account: ``GRANT SELECT`` alone) is found at
open (``has_table_privilege`` for every grant recording needs) or, should a grant be revoked
later, by the server refusing a write (which rolls that transaction back whole). Planning reads
the shared rows either way; a profiler (``record_in_memory``) then keeps what it measures in a
private in-memory SQLite store for this process, read together with the server's rows, and
the server gets nothing. The warning names the grants missing.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import logging
import os
import re
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import unquote

from tensor_graphs.db.hardware import Hardware, current
from tensor_graphs.db.schema import NATURAL_KEY, SCHEMA_VERSION, render
from tensor_graphs.db.store import (
    _COLUMNS,
    Database,
    Measurement,
    _complete,
    _instances,
    _lines,
    _parse_line,
    _text_file,
    _values,
)
from tensor_graphs.errors import DatabaseError

BATCH = 1000  # rows per INSERT statement (one round trip each; a batch is one transaction)
RETRIES = 8  # attempts of one transaction before its error reaches the caller
RETRY_SECONDS = 30.0  # and how long they may take: a server gone for good failed a profile
# after 8 minutes (8 attempts, each waiting the pool's 30 s for a connection)
BACKOFF = (0.05, 2.0)  # first and longest wait between attempts, seconds (doubling)
POOL_SIZE = (1, 4)  # connections kept open, and at most (a profiler's claim renewer + work)
CONNECT_TIMEOUT = 10  # seconds: an unreachable server fails fast with its URL named
MIGRATION_LOCK = 0x54474442  # advisory lock key of schema changes ("TGDB")

# the column types of a measurement row, in _COLUMNS order, for batched inserts via unnest()
_TYPES = ("text",) * 6 + ("integer",) + ("float8",) * 4 + ("text", "float8", "float8", "float8")
_INSERT = (f"INSERT INTO measurements ({', '.join(_COLUMNS)}) SELECT * FROM unnest("
           + ", ".join(f"%s::{t}[]" for t in _TYPES)
           + f") ON CONFLICT ({', '.join(NATURAL_KEY)}) DO NOTHING RETURNING 1")
_RELEASE = ("DELETE FROM claims c USING unnest(%s::text[], %s::text[], %s::text[], %s::text[], "
            "%s::text[]) AS k(kernel, source_hash, signature, device, libs) WHERE "
            "c.kernel = k.kernel AND c.source_hash = k.source_hash AND "
            "c.signature = k.signature AND c.device = k.device AND c.libs = k.libs")
_INSTALL = 'pip install "tensor_graphs[postgres]"'
# the grants recording needs, one row per table (checked at open: a role lacking any may only
# read, and a profiler keeps its rows in memory rather than half-write them)
RECORDING_GRANTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("measurements", ("INSERT",)),  # the rows themselves
    ("claims", ("INSERT", "UPDATE", "DELETE")),  # taking, renewing and releasing work
    ("meta", ("UPDATE",)),  # the revision counter every write increments
    ("calibration", ("INSERT", "UPDATE")),  # a device's peak rates and read bandwidth
)


def _psycopg():
    """psycopg and its pool, or a DatabaseError naming the extra that installs them."""
    try:
        import psycopg
        import psycopg_pool
    except ImportError as exc:
        raise DatabaseError(f"a postgresql:// database needs psycopg 3 and psycopg_pool ({exc}); "
                            f"{_INSTALL}, or point TG_DB or db= at a file") from exc
    # the pool logs each failed connect as a warning, which Python prints to stderr where no
    # logging is configured (38 lines while a server was down); the DatabaseError says it
    # once. A NullHandler keeps them from that fallback only: a user's handlers still get them
    pool_log = logging.getLogger("psycopg.pool")
    if not any(isinstance(h, logging.NullHandler) for h in pool_log.handlers):
        pool_log.addHandler(logging.NullHandler())
    return psycopg, psycopg_pool


def masked(url: str) -> str:
    """The URL without its password, for messages and the plan cache's key."""
    return re.sub(r"(://[^/@:]*):[^/@]*@", r"\1:***@", url)


def said(exc: BaseException, url: str) -> str:
    """What ``exc`` (psycopg's, about ``url``) says, for one line of a ``DatabaseError``:
    libpq's messages of several lines ("Connection refused", then "Is the server running on
    that host ...?") on one line, and the password masked. libpq quotes what it could not
    parse, the whole URL (in URI: "postgresql://me:secret@[host") or the password itself
    (invalid percent-encoded token: "secret"), and that went to the terminal and to logs.
    Only what it quotes is masked: a short password's letters elsewhere in the text stay."""
    text = " ".join(str(exc).split()).replace(url, masked(url))
    found = re.search(r"://[^/@:]*:([^/@]*)@", url)
    for secret in {found.group(1), unquote(found.group(1))} if found else ():
        text = text.replace(f'"{secret}"', '"***"')
    return text


def _lock_key(hw: Hardware) -> int:
    """A signed 64-bit advisory lock key for a hardware key's device and libs."""
    digest = hashlib.sha256(f"{hw.device}\0{hw.libs}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class _RefusedError(DatabaseError):
    """The server refused a statement for a grant this role lacks (its transaction rolled
    back whole)."""


def _or_memory(method):
    """``method`` on the server until records go to memory (``record_in_memory``), then on
    the in-memory store; a write the server refuses for a missing grant switches (or raises,
    see ``_refused``)."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        if self._memory is None:
            try:
                return method(self, *args, **kwargs)
            except _RefusedError as exc:
                self._refused(exc)
        return getattr(self._memory, method.__name__)(*args, **kwargs)
    return run


class _Rows:
    """A fetched result, read the way ``sqlite3`` cursors are by the shared read methods."""

    def __init__(self, rows: list[tuple]):
        self._rows = rows

    def fetchone(self) -> tuple | None:
        return self._rows[0] if self._rows else None

    def fetchall(self) -> list[tuple]:
        return self._rows

    def __iter__(self) -> Iterator[tuple]:
        return iter(self._rows)


class _Reader:
    """The connection ``Database``'s read methods see: each statement (SQLite's ``?``
    placeholders) runs on a pooled connection, retried when the connection drops."""

    def __init__(self, db: PostgresDatabase):
        self._db = db

    def execute(self, sql: str, args: Sequence = ()) -> _Rows:
        sql = sql.replace("?", "%s")
        return _Rows(self._db._attempt(lambda conn: conn.execute(sql, tuple(args)).fetchall(),
                                       "reading"))


class PostgresDatabase(Database):
    """The measurement database in a PostgreSQL database (``postgresql://`` URL); see the
    module doc. Made by ``Database(url)`` and ``open_db(url)``."""

    def __init__(self, path: str):
        psycopg, psycopg_pool = _psycopg()
        self._url = str(path)
        self.path = masked(self._url)
        self.instance = next(_instances)
        self.derived: dict[str, object] = {}
        self.readonly = False
        self.readonly_reason: str | None = None
        self.open_mode = "postgresql"
        self._lock = threading.RLock()
        self._conn = None
        self._retry = (psycopg.OperationalError,)  # dropped connections, serialization
        self._psycopg = psycopg  # failures and deadlocks are all OperationalErrors
        # this process's rows once the server refused them (``record_in_memory``), and
        # whether a refusal found later (a grant revoked) switches to it
        self._memory: Database | None = None
        self._fallback = False
        self._claimed = False  # whether this process took claims on the server
        try:  # one direct connection first: a wrong URL fails now, naming what is wrong
            psycopg.connect(self._url, connect_timeout=CONNECT_TIMEOUT).close()
        except psycopg.Error as exc:
            raise DatabaseError(f"cannot connect to the measurement database {self.path}: "
                                f"{said(exc, self._url)}; check the URL, the server and its "
                                "access rules, or point TG_DB or db= at a file") from exc
        self._pool = self._new_pool()
        try:
            self._attempt(self._migrate_in, "migrating", transaction=True)
            reason = self._attempt(_missing_grants, "reading")
        except BaseException:
            self.close()
            raise
        if reason:  # a role that may only read: plans still come from the shared rows
            self.readonly, self.readonly_reason = True, reason

    # ------------------------------------------------------------------ plumbing
    def _new_pool(self):
        """A pool owned by this process (``_here`` makes a forked child its own)."""
        _, psycopg_pool = _psycopg()
        self._pid = os.getpid()
        return psycopg_pool.ConnectionPool(
            self._url, min_size=POOL_SIZE[0], max_size=POOL_SIZE[1], open=True,
            timeout=CONNECT_TIMEOUT,  # for a connection: what one direct connect waits
            check=psycopg_pool.ConnectionPool.check_connection, name="tensor_graphs",
            kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT})

    def _here(self):
        """The pool, made anew in a forked child: the parent's connections share their
        sockets with it (a child using one would corrupt the parent's session) and its
        threads did not survive the fork; they are dropped, never closed from here."""
        with self._lock:
            if self._pool is not None and self._pid != os.getpid():
                self._pool = self._new_pool()
            return self._pool

    @property
    def closed(self) -> bool:
        return self._pool is None

    def close(self) -> None:
        """Close the pool's connections (only this process's own: see ``_here``)."""
        with self._lock:
            pool, self._pool = getattr(self, "_pool", None), None
        if pool is not None and self._pid == os.getpid():  # a forked child drops its parent's
            pool.close()

    def _attempt(self, work: Callable[[Any], Any], what: str, transaction: bool = False,
                 locks: Iterable[int] = ()) -> Any:
        """``work(connection)``, in one transaction if asked (taking the advisory ``locks``
        first, in order), retried on a dropped connection, a serialization failure or a
        deadlock: a failed transaction rolled back whole, and writes are idempotent."""
        wait, start = BACKOFF[0], time.monotonic()
        for attempt in itertools.count(1):
            pool = self._here()
            if pool is None:
                raise DatabaseError(f"the measurement database {self.path} is closed")
            if transaction and self.readonly:
                raise DatabaseError(
                    f"the measurement database {self.path} is read-only "
                    f"({self.readonly_reason}), so nothing can be recorded; point TG_DB or db= "
                    "at a database this role may write (check db.readonly first to plan "
                    "without recording)")
            try:
                with pool.connection() as conn:
                    if not transaction:
                        return work(conn)
                    with conn.transaction():
                        for key in sorted(set(locks)):
                            conn.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
                        return work(conn)
            except self._retry as exc:
                if attempt >= RETRIES or time.monotonic() - start > RETRY_SECONDS:
                    raise DatabaseError(
                        f"{what} the measurement database {self.path} failed {attempt} times "
                        f"({type(exc).__name__}: {said(exc, self._url)}); check that the "
                        "server is up and reachable") from exc
            except self._psycopg.errors.InsufficientPrivilege as exc:
                raise _RefusedError(f"{what} the measurement database {self.path} was refused: "
                               f"{said(exc, self._url)}") from exc
            except self._psycopg.Error as exc:
                raise DatabaseError(f"{what} the measurement database {self.path} failed: "
                                    f"{said(exc, self._url)}") from exc
            time.sleep(wait)
            wait = min(wait * 2, BACKOFF[1])
        raise AssertionError("unreachable")

    def _migrate_in(self, conn) -> None:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        version = self._version(conn)
        if version > SCHEMA_VERSION:
            raise DatabaseError(
                f"{self.path} was written by a newer tensor_graphs (schema version {version}; "
                f"this version reads up to {SCHEMA_VERSION}); it was left untouched. Upgrade "
                "tensor_graphs or point TG_DB or db= at another database.")
        if version == SCHEMA_VERSION:
            return
        for step in render("postgresql")[version:]:
            for statement in step:
                conn.execute(statement)
        conn.execute("INSERT INTO meta (key, value) VALUES ('schema', %s) ON CONFLICT (key) "
                     "DO UPDATE SET value = excluded.value", (SCHEMA_VERSION,))

    def _version(self, conn) -> int:
        """The schema version; refuses a database whose tables of our names are not ours."""
        names = ("meta", "measurements", "calibration", "claims")
        found = [n for n in names
                 if conn.execute("SELECT to_regclass(%s)", (n,)).fetchone()[0] is not None]
        row = None
        if "meta" in found:
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() \
                if _has_columns(conn, "meta", ("key", "value")) else None
        if row is None and found:
            raise DatabaseError(
                f"{self.path} holds tables named {', '.join(found)} that tensor_graphs did not "
                "make (no schema version in meta); they were left untouched. Point TG_DB or "
                "db= at another database (or another schema via the URL's options).")
        return 0 if row is None else int(row[0])

    @contextmanager
    def _read(self) -> Iterator[_Reader]:
        if self._pool is None:
            raise DatabaseError(f"the measurement database {self.path} is closed")
        yield _Reader(self)

    def _write(self, revise: bool = True):
        # every writing method is overridden to go through _attempt; SQLite's transaction
        # statements must never reach the server
        raise AssertionError("PostgresDatabase writes through _attempt")

    def record_in_memory(self) -> bool:
        """As ``Database.record_in_memory``: for a role that may only read, this process's
        records go to a private in-memory store from now on, read together with the server's
        rows, nothing sent to the server; warns once, naming the grants missing. False when
        the role may write; a write the server refuses later (a grant revoked) then switches
        to memory too, rather than failing the profile."""
        with self._lock:
            self._fallback = True
            if not self.readonly or self._memory is not None:
                return False
        self._switch()
        return True

    def _switch(self) -> None:
        """Records go to memory from now on (once; warned)."""
        with self._lock:
            if self._memory is not None:
                return
            self._memory = Database(":memory:")
            self.readonly = False
        warnings.warn(
            f"the measurement database {self.path} is read-only for this role "
            f"({self.readonly_reason}): what this process measures is kept in memory, planned "
            "with beside the server's rows, and lost when it exits; nothing is written to the "
            "server. Give the role those grants, or point TG_DB or db= at a database it may "
            "write, to keep the measurements.", RuntimeWarning, stacklevel=4)

    def _refused(self, exc: _RefusedError) -> None:
        """The server refused a write for a grant this role lacks (rolled back whole): read-only
        from now on; switched to memory if this process asked for it (``record_in_memory``),
        else raises ``DatabaseError`` naming the grants. The grants are asked for before the
        lock is taken: that query may retry with backoff (``_attempt``), and the lock guards
        what every other thread's record checks."""
        reason = self._attempt(_missing_grants, "reading") or str(exc)
        with self._lock:
            self.readonly = True
            self.readonly_reason = reason
        if not self._fallback:
            raise DatabaseError(
                f"the measurement database {self.path} is read-only ({self.readonly_reason}), "
                "so nothing can be recorded; point TG_DB or db= at a database this role may "
                "write (check db.readonly first to plan without recording)") from exc
        self._switch()

    # ------------------------------------------------------------------ writing
    @_or_memory
    def record(self, m: Measurement) -> Measurement:
        """Store one measurement (a resend of the same one adds nothing)."""
        m = _complete(m)
        self._store([m])
        return m

    @_or_memory
    def record_many(self, ms: Iterable[Measurement]) -> int:
        """Store several measurements in one transaction, in batches of ``BATCH`` rows per
        statement; returns how many were given (rows already stored are not doubled)."""
        rows = [_complete(m) for m in ms]
        if rows:
            self._store(rows)
        return len(rows)

    def _store(self, rows: Sequence[Measurement]) -> int:
        """Insert ``rows`` and release their claims in one transaction; returns how many
        were new. Idempotent, so retried whole after any failure."""
        def work(conn) -> int:
            added = 0
            for start in range(0, len(rows), BATCH):
                chunk = [_values(m) for m in rows[start:start + BATCH]]
                columns = [list(c) for c in zip(*chunk)]
                added += len(conn.execute(_INSERT, columns).fetchall())
                conn.execute(_RELEASE, [columns[3], columns[4], columns[5], columns[1],
                                        columns[2]])
            if added:
                conn.execute("UPDATE meta SET value = value + 1 WHERE key = 'revision'")
            return added
        return self._attempt(work, "writing to", transaction=True,
                             locks=[_lock_key(m.hardware) for m in rows])

    @_or_memory
    def set_calibration(self, hardware: Hardware | None, rates: Mapping[str, float]) -> None:
        """Store the device's measured peak rates (replacing earlier ones)."""
        import json

        hw = hardware or current()
        text = json.dumps(dict(rates), sort_keys=True)

        def work(conn) -> None:
            conn.execute('INSERT INTO calibration (device, libs, rates, "when") VALUES '
                         '(%s, %s, %s, %s) ON CONFLICT (device, libs) DO UPDATE SET '
                         'rates = excluded.rates, "when" = excluded."when"',
                         (hw.device, hw.libs, text, time.time()))
            conn.execute("UPDATE meta SET value = value + 1 WHERE key = 'revision'")
        self._attempt(work, "writing to", transaction=True)

    @_or_memory
    def import_jsonl(self, path_or_file) -> int:
        """Merge rows written by ``export_jsonl``, skipping rows already present (same
        hardware, kernel, source hash, signature and time); returns how many were new."""
        where = f"{path_or_file}, " if isinstance(path_or_file, (str, bytes)) or \
            hasattr(path_or_file, "__fspath__") else ""
        with _text_file(path_or_file, "rb") as f:
            incoming = [_parse_line(line, number, where) for number, line in _lines(f, where)
                        if line.strip()]
        return self._store(incoming) if incoming else 0

    @_or_memory
    def prune(self, stale_hashes: Mapping[str, str] | None = None,
              older_than: float | None = None, failures: bool = False) -> int:
        """As ``Database.prune``."""
        stale = self._stale(stale_hashes) if stale_hashes else []
        if not stale and older_than is None and not failures:
            return 0

        def work(conn) -> int:
            deleted = 0
            for kernel, shash, _ in stale:
                deleted += conn.execute("DELETE FROM measurements WHERE kernel = %s AND "
                                        "source_hash = %s", (kernel, shash)).rowcount
            if older_than is not None:
                deleted += conn.execute('DELETE FROM measurements WHERE "when" < %s',
                                        (time.time() - older_than,)).rowcount
            if failures:
                deleted += conn.execute("DELETE FROM measurements WHERE failure IS NOT NULL"
                                        ).rowcount
            if deleted:
                conn.execute("UPDATE meta SET value = value + 1 WHERE key = 'revision'")
            return deleted
        return self._attempt(work, "pruning", transaction=True)

    # ------------------------------------------------------------------ claims
    def claim(self, work: Sequence[tuple[str, str, str]], owner: str, lease: float,
              limit: int | None = None, hardware: Hardware | None = None) -> list[str]:
        """As ``Database.claim``: one transaction under the hardware key's advisory lock
        (records of that key take it too), and the claim itself an upsert that takes a row
        only from its own owner or an expired lease. Once records go to memory
        (``record_in_memory``), claimed there, an item with a row on the server "done"."""
        items = [tuple(w) for w in work]
        if self._memory is None:
            try:
                return self._claim(items, owner, lease, limit, hardware)
            except _RefusedError as exc:
                self._refused(exc)
        done = self._attempt(lambda conn: _done(conn, items, hardware or current()),
                             "reading") if items else set()
        rest = iter(self._memory.claim([w for w in items if w not in done], owner, lease,
                                       limit, hardware))
        return ["done" if w in done else next(rest) for w in items]

    def _claim(self, items: list[tuple], owner: str, lease: float, limit: int | None,
               hardware: Hardware | None) -> list[str]:
        hw = hardware or current()

        def step(conn) -> list[str]:
            now = time.time()
            kernels, hashes, sigs = ([w[i] for w in items] for i in range(3))
            done = _done(conn, items, hw)
            held = {(k, h, s): (o, e) for k, h, s, o, e in conn.execute(
                f"SELECT t.kernel, t.source_hash, t.signature, t.owner, t.expires FROM {_KEYS} "
                f"JOIN claims t ON {_MATCH}", (kernels, hashes, sigs, hw.device, hw.libs))}
            states, wanted = [], []
            for item in items:
                item = tuple(item)
                if limit is not None and len(wanted) >= limit:
                    states.append("later")
                elif item in done:
                    states.append("done")
                elif item in held and held[item][0] != owner and held[item][1] > now:
                    states.append("held")
                else:
                    states.append("claimed")
                    wanted.append(item)
            if wanted:
                got = set(conn.execute(
                    "INSERT INTO claims (kernel, source_hash, signature, device, libs, owner, "
                    "expires) SELECT w.kernel, w.source_hash, w.signature, %s, %s, %s, %s FROM "
                    f"{_KEYS} ON CONFLICT (kernel, source_hash, signature, device, libs) DO "
                    "UPDATE SET owner = excluded.owner, expires = excluded.expires WHERE "
                    "claims.owner = excluded.owner OR claims.expires <= %s "
                    "RETURNING kernel, source_hash, signature",
                    (hw.device, hw.libs, owner, now + lease, *([w[i] for w in wanted]
                                                               for i in range(3)), now)))
                states = ["held" if s == "claimed" and tuple(i) not in got else s
                          for s, i in zip(states, items)]
                self._claimed = True
            return states
        if not items:
            return []
        return self._attempt(step, "claiming work in", transaction=True, locks=[_lock_key(hw)])

    @_or_memory
    def renew(self, owner: str, lease: float) -> int:
        """Extend every claim of ``owner`` to ``lease`` seconds from now; returns how many."""
        return self._attempt(lambda conn: conn.execute(
            "UPDATE claims SET expires = %s WHERE owner = %s",
            (time.time() + lease, owner)).rowcount, "renewing claims in", transaction=True)

    def release(self, owner: str) -> int:
        """Drop every claim of ``owner`` (work it will not record); returns how many. Once
        records go to memory, there too: the server may still hold claims taken before a
        grant was revoked (dropped where the role may, else they expire with their lease)."""
        mem = self._memory
        if mem is not None and not self._claimed:
            return mem.release(owner)
        try:
            n = self._attempt(lambda conn: conn.execute(
                "DELETE FROM claims WHERE owner = %s", (owner,)).rowcount,
                "releasing claims in", transaction=True)
        except _RefusedError as exc:
            if mem is None:
                self._refused(exc)
                mem = self._memory
            n = 0
        return n + (0 if mem is None else mem.release(owner))

    # ------------------------------------------------------------------ reading
    def rows_named(self, prefix: str, hardware: Hardware | None = None) -> list[Measurement]:
        """As ``Database.rows_named``; ``starts_with``, since a range on text compares by the
        database's collation, which need not be code-point order."""
        from tensor_graphs.db.store import _SELECT, _from_row

        hw = hardware or current()
        with self._read() as conn:
            rows = conn.execute(
                f"{_SELECT} WHERE starts_with(kernel, ?) AND device = ? AND libs = ? "
                'AND failure IS NULL ORDER BY "when", id', (prefix, hw.device, hw.libs))
        mem = self._memory
        return _oldest_first([_from_row(r) for r in rows],
                             [] if mem is None else mem.rows_named(prefix, hardware))

    # ---------------------------------------- reads, with this process's rows once in memory
    @property
    def revision(self) -> int:
        """The server's counter, plus this process's in-memory one (both only grow)."""
        mem, server = self._memory, Database.revision.fget(self)
        return server if mem is None else server + mem.revision

    def lookup(self, kernel: str, signature: str, hardware: Hardware | None = None,
               source_hash: str | None = None) -> Measurement | None:
        """As ``Database.lookup``, over the server's rows and this process's."""
        found = super().lookup(kernel, signature, hardware, source_hash)
        mem = self._memory
        mine = None if mem is None else mem.lookup(kernel, signature, hardware, source_hash)
        if found is None or mine is None:
            return mine or found
        hw = hardware or current()

        def rank(m: Measurement) -> tuple:  # the order of Database.lookup's ORDER BY
            return m.source_hash == (source_hash or ""), m.hardware.machine == hw.machine, m.when
        return mine if rank(mine) >= rank(found) else found

    def rows_for(self, kernel: str, hardware: Hardware | None = None) -> list[Measurement]:
        """As ``Database.rows_for``, over the server's rows and this process's."""
        mem = self._memory
        return _oldest_first(super().rows_for(kernel, hardware),
                             [] if mem is None else mem.rows_for(kernel, hardware))

    def calibration(self, hardware: Hardware | None = None) -> dict | None:
        """This process's calibration if it made one, else the server's."""
        mem = self._memory
        mine = None if mem is None else mem.calibration(hardware)
        return mine if mine is not None else super().calibration(hardware)

    def rows(self, kernel: str | None = None, limit: int | None = None) -> list[Measurement]:
        """As ``Database.rows``, over the server's rows and this process's."""
        mem = self._memory
        if mem is None:
            return super().rows(kernel, limit)
        both = _oldest_first(super().rows(kernel, limit), mem.rows(kernel, limit))[::-1]
        return both if limit is None else both[:int(limit)]

    def claims(self) -> list[tuple[str, str, str, str, float]]:
        """The server's claims and this process's."""
        mem = self._memory
        found = super().claims() + ([] if mem is None else mem.claims())
        return sorted(found, key=lambda c: c[4])

    def stats(self, current_hashes: Mapping[str, str] | None = None) -> dict:
        """The server's counts, and ``in_memory``: this process's rows the server did not
        take (``record_in_memory``)."""
        out = super().stats(current_hashes)
        mem = self._memory
        out["in_memory"] = 0 if mem is None else mem.stats()["rows"]
        return out


def _missing_grants(conn) -> str | None:
    """Why this role may not record: the grants it lacks (``RECORDING_GRANTS``) as the
    statements that give them; None when it has them all."""
    checks = [(t, p) for t, privileges in RECORDING_GRANTS for p in privileges]
    row = conn.execute("SELECT quote_ident(current_user), " + ", ".join(
        "has_table_privilege(%s, %s)" for _ in checks),
        [x for check in checks for x in check]).fetchone()
    user, held = row[0], dict(zip(checks, row[1:]))
    lacking = [(t, [p for p in privileges if not held[(t, p)]])
               for t, privileges in RECORDING_GRANTS]
    grants = [f"GRANT {', '.join(ps)} ON {t} TO {user}" for t, ps in lacking if ps]
    return f"role {user} may not record: {'; '.join(grants)}" if grants else None


# the work items of a claim as a table w, and a table t's rows of them on a hardware key
_KEYS = "unnest(%s::text[], %s::text[], %s::text[]) AS w(kernel, source_hash, signature)"
_MATCH = ("t.kernel = w.kernel AND t.source_hash = w.source_hash AND "
          "t.signature = w.signature AND t.device = %s AND t.libs = %s")


def _done(conn, items: Sequence[tuple], hw: Hardware) -> set[tuple]:
    """The items (kernel, source hash, signature) with a row on ``hw``'s device and libs."""
    kernels, hashes, sigs = ([w[i] for w in items] for i in range(3))
    return {tuple(r) for r in conn.execute(
        f"SELECT DISTINCT w.kernel, w.source_hash, w.signature FROM {_KEYS} JOIN "
        f"measurements t ON {_MATCH}", (kernels, hashes, sigs, hw.device, hw.libs))}


def _oldest_first(server: list[Measurement], mine: list[Measurement]) -> list[Measurement]:
    """Rows of the server and of this process, oldest first (the server's first on a tie)."""
    return sorted(server + mine, key=lambda m: m.when) if mine else server


def _has_columns(conn, table: str, columns: Sequence[str]) -> bool:
    found = {r[0] for r in conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
        "AND table_schema = current_schema()", (table,))}
    return set(columns) <= found


__all__ = ["BATCH", "RETRIES", "PostgresDatabase", "masked"]
