"""The service's state: one SQLite database and the run folders, under ``--state``.

Layout of a state folder::

    STATE/mecsim.sqlite      runs, their rounds, sweeps (this module)
    STATE/mecsim.lock        held (flock) by the one server using the folder
    STATE/runs/<run-id>/     each run's records, as `mecsim run` writes them
    STATE/sweeps/<sweep-id>/ each sweep's table and plot
    STATE/tmp/               scenarios being validated

Every change is one SQLite transaction (WAL journal, ``synchronous=FULL``), so a server
killed at any point leaves the database as it was after the last change. A run's status
is one of :data:`STATUSES`; the queue is the runs whose status is ``queued`` or
``interrupted``, in submission order (``seq``), so an interrupted run goes back to the
head of the queue it was taken from.

A folder that is not a mecsim state folder (other files but no database, a database of
another application, a damaged database) raises :class:`StateError` with one line
saying what is wrong; nothing in it is changed.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

DB_NAME = "mecsim.sqlite"
LOCK_NAME = "mecsim.lock"
#: ``PRAGMA application_id`` of a mecsim state database ("MECS" in ASCII).
APPLICATION_ID = 0x4D454353
SCHEMA_VERSION = 1

STATUSES = ("queued", "running", "finished", "failed", "cancelled", "interrupted")
#: Statuses a run never leaves.
TERMINAL = frozenset({"finished", "failed", "cancelled"})
#: Statuses of runs waiting for a worker (the queue).
WAITING = ("queued", "interrupted")

_SCHEMA = """
CREATE TABLE runs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    status TEXT NOT NULL,
    submitted_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    rounds_planned INTEGER NOT NULL,
    rounds_done INTEGER NOT NULL DEFAULT 0,
    best_accuracy REAL,
    emulated_s REAL,
    host_wall_s REAL NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    scenario_yaml TEXT NOT NULL,
    error TEXT,
    traceback TEXT,
    history TEXT NOT NULL
);
CREATE INDEX runs_status ON runs (status, seq);
CREATE TABLE rounds (
    run_id TEXT NOT NULL,
    round INTEGER NOT NULL,
    row TEXT NOT NULL,
    PRIMARY KEY (run_id, round)
);
CREATE TABLE sweeps (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    finished_at REAL,
    request TEXT NOT NULL,
    error TEXT
);
"""


class StateError(Exception):
    """A state folder that cannot be used; ``str()`` is one line."""


class QueueFull(Exception):
    """The number of waiting runs has reached the service's bound."""


@dataclass
class Run:
    """One row of ``runs``, decoded."""

    seq: int
    id: str
    name: str
    algorithm: str
    status: str
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    rounds_planned: int
    rounds_done: int
    best_accuracy: float | None
    emulated_s: float | None
    host_wall_s: float
    attempts: int
    cancel_requested: bool
    scenario_yaml: str
    error: str | None
    traceback: str | None
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def eta_s(self) -> float | None:
        """Host seconds left of a running run: mean host wall time per round x rounds left."""
        if self.status != "running" or self.rounds_done == 0:
            return None
        return self.host_wall_s / self.rounds_done * max(0, self.rounds_planned - self.rounds_done)


@dataclass
class Sweep:
    seq: int
    id: str
    status: str
    created_at: float
    finished_at: float | None
    request: dict[str, Any]
    error: str | None


def _run(row: sqlite3.Row) -> Run:
    d = dict(row)
    d["cancel_requested"] = bool(d["cancel_requested"])
    d["history"] = json.loads(d["history"])
    return Run(**d)


def _sweep(row: sqlite3.Row) -> Sweep:
    d = dict(row)
    d["request"] = json.loads(d["request"])
    return Sweep(**d)


def _json_safe(value: Any) -> Any:
    """NaN and infinities as None (JSON has neither); numpy scalars as Python numbers."""
    if hasattr(value, "item") and not isinstance(value, (list, dict, str)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _row_json(row: dict[str, Any]) -> str:
    """A round row as the store keeps it: JSON, NaN and infinities as null."""
    return json.dumps({k: _json_safe(v) for k, v in row.items()})


class Store:
    """The state folder of one server; methods are safe to call from any thread."""

    def __init__(self, state_dir: str | Path, *, lock: bool = True) -> None:
        self.dir = Path(state_dir)
        self._check_folder()
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock_file: IO[str] | None = None
        had_lock = (self.dir / LOCK_NAME).exists()
        if lock:
            self._take_lock()
        self.runs_dir = self.dir / "runs"
        self.sweeps_dir = self.dir / "sweeps"
        self.tmp_dir = self.dir / "tmp"
        self._mutex = threading.RLock()  # the writer connection's
        self._read_mutex = threading.Lock()
        try:
            self._conn = self._open()
            self._reader = self._open_reader()
        except StateError:  # leave the folder as it was
            if self._lock_file is not None:
                self._lock_file.close()
                if not had_lock:
                    (self.dir / LOCK_NAME).unlink(missing_ok=True)
            raise
        for d in (self.runs_dir, self.sweeps_dir, self.tmp_dir):
            d.mkdir(exist_ok=True)

    # ------------------------------------------------------------------ opening

    def _check_folder(self) -> None:
        if self.dir.exists() and not self.dir.is_dir():
            raise StateError(f"{self.dir}: not a folder")
        db = self.dir / DB_NAME
        if self.dir.is_dir() and not db.exists():
            ours = {DB_NAME, LOCK_NAME, "runs", "sweeps", "tmp"}
            other = sorted(p.name for p in self.dir.iterdir() if p.name not in ours)
            if other or any(
                (self.dir / d).is_dir() and any((self.dir / d).iterdir())
                for d in ("runs", "sweeps")
            ):
                shown = ", ".join(other[:3]) or "runs/ with files"
                raise StateError(
                    f"{self.dir}: not a mecsim state folder (it holds {shown} "
                    f"but no {DB_NAME}); give a new or empty folder"
                )

    def _take_lock(self) -> None:
        path = self.dir / LOCK_NAME
        f = path.open("a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            holder = f.read().strip() or "?"
            f.close()
            raise StateError(f"{self.dir}: in use by another mecsim serve (pid {holder})") from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        self._lock_file = f

    def _open(self) -> sqlite3.Connection:
        db = self.dir / DB_NAME
        fresh = not db.exists() or db.stat().st_size == 0
        try:
            conn = sqlite3.connect(db, check_same_thread=False, isolation_level=None, timeout=30)
            conn.row_factory = sqlite3.Row
            if fresh:  # one transaction: a half-made database is never left behind
                conn.executescript(
                    f"BEGIN IMMEDIATE;\n{_SCHEMA}\n"
                    f"PRAGMA application_id = {APPLICATION_ID};\n"
                    f"PRAGMA user_version = {SCHEMA_VERSION};\nCOMMIT;"
                )
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if app_id != APPLICATION_ID:
                conn.close()
                raise StateError(
                    f"{db}: a SQLite database of another application, not a mecsim state database"
                )
            if version > SCHEMA_VERSION:
                conn.close()
                raise StateError(
                    f"{db}: made by a newer mecsim (schema {version}; this one "
                    f"reads {SCHEMA_VERSION})"
                )
            check = conn.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                conn.close()
                raise StateError(f"{db}: damaged database ({check})")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA foreign_keys = ON")
        except sqlite3.DatabaseError as exc:
            raise StateError(f"{db}: not a usable mecsim state database ({exc})") from None
        return conn

    def _open_reader(self) -> sqlite3.Connection:
        """A second connection for reads. In WAL mode a reader never waits for the
        writer: a status request does not queue behind a round's commit and its fsync
        (which, on the writer's connection, blocked the API's event loop for as long)."""
        try:
            conn = sqlite3.connect(
                self.dir / DB_NAME, check_same_thread=False, isolation_level=None, timeout=30
            )
        except sqlite3.DatabaseError as exc:
            raise StateError(
                f"{self.dir / DB_NAME}: not a usable mecsim state database ({exc})"
            ) from None
        conn.row_factory = sqlite3.Row
        return conn

    def close(self) -> None:
        with self._read_mutex:
            self._reader.close()
        with self._mutex:
            self._conn.close()
        if self._lock_file is not None:
            self._lock_file.close()  # releases the flock
            self._lock_file = None

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (taken at once: no other writer can interleave)."""
        with self._mutex:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _query(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        """A read of committed data (every write commits before its method returns)."""
        with self._read_mutex:
            return self._reader.execute(sql, args).fetchall()

    @staticmethod
    def _history(
        conn: sqlite3.Connection, run_id: str, status: str, now: float, note: str | None = None
    ) -> str:
        row = conn.execute("SELECT history FROM runs WHERE id = ?", (run_id,)).fetchone()
        hist = json.loads(row["history"]) if row else []
        entry: dict[str, Any] = {"status": status, "at": now}
        if note:
            entry["note"] = note
        hist.append(entry)
        return json.dumps(hist)

    # ------------------------------------------------------------------ runs

    def run_dir(self, run_id: str) -> Path:
        return self.runs_dir / run_id

    def add_run(
        self,
        run_id: str,
        name: str,
        algorithm: str,
        scenario_yaml: str,
        rounds_planned: int,
        max_waiting: int,
    ) -> Run:
        """Queue a run; :class:`QueueFull` when ``max_waiting`` runs already wait."""
        now = time.time()
        with self._tx() as c:
            waiting = c.execute(
                f"SELECT count(*) FROM runs WHERE status IN ({','.join('?' * len(WAITING))})",
                WAITING,
            ).fetchone()[0]
            if waiting >= max_waiting:
                raise QueueFull(
                    f"{waiting} runs are waiting (the service's bound is "
                    f"{max_waiting}); submit again later"
                )
            c.execute(
                "INSERT INTO runs (id, name, algorithm, status, submitted_at, rounds_planned,"
                " scenario_yaml, history) VALUES (?, ?, ?, 'queued', ?, ?, ?, ?)",
                (
                    run_id,
                    name,
                    algorithm,
                    now,
                    rounds_planned,
                    scenario_yaml,
                    json.dumps([{"status": "queued", "at": now}]),
                ),
            )
        run = self.get_run(run_id)
        assert run is not None
        return run

    def get_run(self, run_id: str) -> Run | None:
        rows = self._query("SELECT * FROM runs WHERE id = ?", (run_id,))
        return _run(rows[0]) if rows else None

    def list_runs(
        self, statuses: list[str] | None = None, limit: int = 100, offset: int = 0
    ) -> tuple[list[Run], int]:
        """Runs, newest first, and how many match in all."""
        where, args = "", cast(tuple[str, ...], ())
        if statuses:
            where = f"WHERE status IN ({','.join('?' * len(statuses))})"
            args = tuple(statuses)
        total = self._query(f"SELECT count(*) FROM runs {where}", args)[0][0]
        rows = self._query(
            f"SELECT * FROM runs {where} ORDER BY seq DESC LIMIT ? OFFSET ?", (*args, limit, offset)
        )
        return [_run(r) for r in rows], total

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(STATUSES, 0)
        for row in self._query("SELECT status, count(*) AS n FROM runs GROUP BY status"):
            out[row["status"]] = row["n"]
        return out

    def waiting(self) -> int:
        c = self.counts()
        return sum(c[s] for s in WAITING)

    def claim_next(self) -> Run | None:
        """The first waiting run, now ``running`` (its ``attempts`` counted), or None.

        The returned run's ``status`` is the one it had while waiting (``queued`` or
        ``interrupted``), so the caller knows whether to start or resume it.
        """
        now = time.time()
        with self._tx() as c:
            row = c.execute(
                f"SELECT * FROM runs WHERE status IN "
                f"({','.join('?' * len(WAITING))}) ORDER BY seq LIMIT 1",
                WAITING,
            ).fetchone()
            if row is None:
                return None
            run = _run(row)
            c.execute(
                "UPDATE runs SET status = 'running', started_at = ?, finished_at = NULL,"
                " attempts = attempts + 1, history = ? WHERE id = ?",
                (now, self._history(c, run.id, "running", now), run.id),
            )
        return run

    def round_done(self, run_id: str, rnd: int, row: dict[str, Any]) -> None:
        """Record a finished round and the run's running figures (one transaction)."""
        with self._tx() as c:
            c.execute(
                "INSERT OR REPLACE INTO rounds (run_id, round, row) VALUES (?, ?, ?)",
                (run_id, rnd, _row_json(row)),
            )
            self._refresh_figures(c, run_id)

    @staticmethod
    def _refresh_figures(c: sqlite3.Connection, run_id: str) -> None:
        c.execute(
            "UPDATE runs SET rounds_done = (SELECT count(*) FROM rounds WHERE run_id = :id),"
            " best_accuracy = (SELECT max(json_extract(row, '$.mean_accuracy')) FROM rounds"
            "  WHERE run_id = :id),"
            " emulated_s = (SELECT json_extract(row, '$.elapsed_s') FROM rounds"
            "  WHERE run_id = :id ORDER BY round DESC LIMIT 1),"
            " host_wall_s = (SELECT coalesce(sum(json_extract(row, '$.host_wall_s')), 0)"
            "  FROM rounds WHERE run_id = :id) WHERE id = :id",
            {"id": run_id},
        )

    def replace_rounds(self, run_id: str, rows: list[dict[str, Any]]) -> None:
        """The run's rounds are ``rows`` (each with its ``round``), in one transaction:
        all or nothing."""
        clean = [(run_id, int(row["round"]), _row_json(row)) for row in rows]
        with self._tx() as c:
            c.execute("DELETE FROM rounds WHERE run_id = ?", (run_id,))
            c.executemany("INSERT INTO rounds (run_id, round, row) VALUES (?, ?, ?)", clean)
            self._refresh_figures(c, run_id)

    def clear_rounds(self, run_id: str, first: int = 0) -> None:
        """Forget a run's rounds from round ``first`` on (0: it starts again from scratch;
        a resumed run: the rounds after its checkpoint, which it runs again)."""
        with self._tx() as c:
            c.execute("DELETE FROM rounds WHERE run_id = ? AND round >= ?", (run_id, first))
            self._refresh_figures(c, run_id)

    def rounds(self, run_id: str, after: int = -1) -> list[dict[str, Any]]:
        """The run's round rows with ``round > after``, in order."""
        rows = self._query(
            "SELECT row FROM rounds WHERE run_id = ? AND round > ? ORDER BY round", (run_id, after)
        )
        return [json.loads(r["row"]) for r in rows]

    def round_texts(self, run_id: str, after: int = -1) -> list[tuple[int, str]]:
        """``(round, its row as the store keeps it: JSON text)`` with ``round > after``, in
        order: what an event stream sends, without decoding and encoding each row."""
        rows = self._query(
            "SELECT round, row FROM rounds WHERE run_id = ? AND round > ? ORDER BY round",
            (run_id, after),
        )
        return [(int(r["round"]), r["row"]) for r in rows]

    def last_round(self, run_id: str) -> dict[str, Any] | None:
        rows = self._query(
            "SELECT row FROM rounds WHERE run_id = ? ORDER BY round DESC LIMIT 1", (run_id,)
        )
        return json.loads(rows[0]["row"]) if rows else None

    def set_status(
        self,
        run_id: str,
        status: str,
        *,
        error: str | None = None,
        traceback: str | None = None,
        note: str | None = None,
    ) -> None:
        if status not in STATUSES:
            raise ValueError(f"unknown status {status!r}")
        now = time.time()
        done = now if status in TERMINAL else None
        with self._tx() as c:
            c.execute(
                "UPDATE runs SET status = ?, finished_at = ?, error = ?, traceback = ?,"
                " history = ? WHERE id = ?",
                (
                    status,
                    done,
                    error,
                    traceback,
                    self._history(c, run_id, status, now, note),
                    run_id,
                ),
            )

    def request_cancel(self, run_id: str) -> str | None:
        """Cancel: a waiting run is cancelled at once (returns ``"cancelled"``); a running
        one is flagged to stop after its current round (``"stopping"``); an ended one is
        left alone (``"ended"``). None: no such run."""
        now = time.time()
        with self._tx() as c:
            row = c.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                return None
            status = row["status"]
            if status in WAITING:
                c.execute(
                    "UPDATE runs SET status = 'cancelled', finished_at = ?, "
                    "cancel_requested = 1, history = ? WHERE id = ?",
                    (
                        now,
                        self._history(c, run_id, "cancelled", now, f"cancelled while {status}"),
                        run_id,
                    ),
                )
                return "cancelled"
            if status == "running":
                c.execute("UPDATE runs SET cancel_requested = 1 WHERE id = ?", (run_id,))
                return "stopping"
            return "ended"

    def cancel_requested(self, run_id: str) -> bool:
        rows = self._query("SELECT cancel_requested FROM runs WHERE id = ?", (run_id,))
        return bool(rows and rows[0][0])

    def recover(self) -> list[str]:
        """At start-up: runs left ``running`` by a server that died are ``interrupted``
        (they resume), except those whose cancel was requested: they, and interrupted runs
        whose cancel was requested, are ``cancelled`` (never resumed). Returns the ids
        of the runs that will resume."""
        now = time.time()
        with self._tx() as c:
            for row in c.execute(
                "SELECT id, status FROM runs WHERE cancel_requested = 1 "
                "AND status IN ('running', 'interrupted')"
            ).fetchall():
                c.execute(
                    "UPDATE runs SET status = 'cancelled', finished_at = ?, history = ? "
                    "WHERE id = ?",
                    (
                        now,
                        self._history(
                            c,
                            row["id"],
                            "cancelled",
                            now,
                            f"its cancel was requested; found {row['status']} at start-up",
                        ),
                        row["id"],
                    ),
                )
            c.execute(
                "UPDATE sweeps SET status = 'cancelled', finished_at = ? "
                "WHERE status = 'running' AND error = 'cancel requested'",
                (now,),
            )
            ids = [r["id"] for r in c.execute("SELECT id FROM runs WHERE status = 'running'")]
            for run_id in ids:
                c.execute(
                    "UPDATE runs SET status = 'interrupted', history = ? WHERE id = ?",
                    (
                        self._history(
                            c, run_id, "interrupted", now, "the server stopped while it ran"
                        ),
                        run_id,
                    ),
                )
        return ids

    # ------------------------------------------------------------------ sweeps

    def sweep_dir(self, sweep_id: str) -> Path:
        return self.sweeps_dir / sweep_id

    def add_sweep(self, sweep_id: str, request: dict[str, Any], max_waiting: int = 100) -> Sweep:
        """Queue a sweep; :class:`QueueFull` when ``max_waiting`` sweeps already wait."""
        with self._tx() as c:
            waiting = c.execute(
                "SELECT count(*) FROM sweeps WHERE status IN ('queued', 'running')"
            ).fetchone()[0]
            if waiting >= max_waiting:
                raise QueueFull(
                    f"{waiting} sweeps are waiting (the service's bound is {max_waiting}); "
                    "submit again later"
                )
            c.execute(
                "INSERT INTO sweeps (id, status, created_at, request) VALUES (?, 'queued', ?, ?)",
                (sweep_id, time.time(), json.dumps(request)),
            )
        sweep = self.get_sweep(sweep_id)
        assert sweep is not None
        return sweep

    def get_sweep(self, sweep_id: str) -> Sweep | None:
        rows = self._query("SELECT * FROM sweeps WHERE id = ?", (sweep_id,))
        return _sweep(rows[0]) if rows else None

    def set_sweep_status(self, sweep_id: str, status: str, error: str | None = None) -> None:
        done = time.time() if status in TERMINAL else None
        with self._tx() as c:
            c.execute(
                "UPDATE sweeps SET status = ?, finished_at = ?, error = ? WHERE id = ?",
                (status, done, error, sweep_id),
            )

    def cancel_sweep(self, sweep_id: str) -> str | None:
        """A waiting sweep is ``cancelled`` at once; a running one is flagged (its thread
        stops at its next point, see :meth:`sweep_cancelled`); an ended one is left
        alone (``"ended"``). None: no such sweep."""
        with self._tx() as c:
            row = c.execute("SELECT status FROM sweeps WHERE id = ?", (sweep_id,)).fetchone()
            if row is None:
                return None
            if row["status"] == "queued":
                c.execute(
                    "UPDATE sweeps SET status = 'cancelled', finished_at = ? WHERE id = ?",
                    (time.time(), sweep_id),
                )
                return "cancelled"
            if row["status"] == "running":
                c.execute("UPDATE sweeps SET error = 'cancel requested' WHERE id = ?", (sweep_id,))
                return "stopping"
            return "ended"

    def start_sweep(self, sweep_id: str) -> bool:
        """A waiting sweep is now ``running``; False when it was cancelled meanwhile (or
        its cancel requested before a restart): then it is ``cancelled`` and not run."""
        with self._tx() as c:
            row = c.execute("SELECT status, error FROM sweeps WHERE id = ?", (sweep_id,)).fetchone()
            if row is None or row["status"] not in ("queued", "running"):
                return False
            if row["error"] == "cancel requested":
                c.execute(
                    "UPDATE sweeps SET status = 'cancelled', finished_at = ? WHERE id = ?",
                    (time.time(), sweep_id),
                )
                return False
            c.execute("UPDATE sweeps SET status = 'running' WHERE id = ?", (sweep_id,))
            return True

    def sweep_cancelled(self, sweep_id: str) -> bool:
        rows = self._query("SELECT status, error FROM sweeps WHERE id = ?", (sweep_id,))
        return bool(rows) and (rows[0][0] == "cancelled" or rows[0][1] == "cancel requested")

    def waiting_sweeps(self) -> list[Sweep]:
        rows = self._query(
            "SELECT * FROM sweeps WHERE status IN ('queued', 'running') ORDER BY seq"
        )
        return [_sweep(r) for r in rows]
