"""A run's folder: its lock, its status, and picking it up again after a kill.

``runs/<run-id>/run.json`` carries ``status``: ``running`` (a process holds the folder's
lock), ``finished``, ``interrupted`` (Ctrl-C, SIGTERM, or killed: a ``running`` status
whose lock nobody holds is read as ``interrupted``), ``cancelled`` or ``failed``, with
``rounds_done`` and ``rounds_planned``.

One process at a time works in a run folder: it holds an exclusive ``flock`` on
``<run dir>/.lock`` for as long as it runs, and the kernel drops the lock when the
process dies however it dies (kill -9 included). A second ``mecsim run --resume`` of the
same folder is refused while the first is alive.

:func:`prepare_resume` takes the folder's newest readable checkpoint, cuts the records
(``rounds.csv``, ``clients.csv``, ``optraces.jsonl``) back to the rounds it holds (rows
after it are re-executed and written again, with the same values) and drops what the
end of a run writes (summary, Parquet, plots), which the resumed run writes anew.
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import pickle
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mecsim.run.loop import ResumePoint
from mecsim.scenario import Scenario, ScenarioError, load_recorded_scenario
from mecsim.store.checkpoints import CheckpointError, CheckpointStore, scenario_digest
from mecsim.store.files import atomic_write_text
from mecsim.store.reader import (
    CLIENT_CHECKS,
    CLIENT_REQUIRED,
    ROUND_CHECKS,
    ROUND_REQUIRED,
    RecordError,
    check_client_rows,
    check_rounds_in_order,
    check_scenario,
    read_meta,
    read_table,
    read_traces,
    rows_from_csv,
)

STATUSES = ("running", "finished", "interrupted", "cancelled", "failed")
LOCK_NAME = ".lock"


class RunFolderError(Exception):
    """A folder that cannot be resumed (or is in use); ``str()`` says why."""


class RunFolderInUse(RunFolderError):
    """Another live process holds the folder's lock."""


class RunFolderFinished(RunFolderError):
    """The run in the folder finished (its ``run.json`` says so): nothing to resume.

    ``lock`` is the folder's lock, still held, when :func:`prepare_resume` was asked to
    keep it (``keep_finished_lock``): the caller then adopts the run under it and must
    release it; else None."""

    def __init__(self, message: str, lock: RunLock | None = None) -> None:
        super().__init__(message)
        self.lock = lock


class RunLock:
    """The exclusive lock of a run folder, held until :meth:`release` or process death."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunFolderInUse(
                f"{self.path.parent}: in use by another mecsim process (its lock is held)"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def is_locked(run_dir: Path) -> bool:
    """Does a live process hold the folder's lock?"""
    path = Path(run_dir) / LOCK_NAME
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


class MetaText:
    """``run.json``'s text: ``json.dumps(meta, indent=1)`` to the byte, each top-level
    value's text kept while the value is unchanged. A run rewrites run.json after every
    round (every server version of an asynchronous run), and its per-client lists
    (devices, samples, placement) made that quadratic in the clients: 10,000 clients and
    10,000 versions spent 530 of 710 s encoding them. "Unchanged" is decided by the
    value's pickle (types and bits: ``1``, ``1.0`` and ``True`` differ, so do ``0.0`` and
    ``-0.0``), so equal pickles give equal JSON; a value mutated in place is re-encoded."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[bytes, str]] = {}

    def __call__(self, meta: dict[str, Any]) -> str:
        if not meta:
            return json.dumps(meta, indent=1)
        parts = []
        for key, value in meta.items():
            try:
                stamp = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:  # not picklable: encoded every time
                stamp = b""
            kept = self._kept.get(key)
            if stamp and kept is not None and kept[0] == stamp:
                text = kept[1]
            else:
                # a value one level down: json.dumps(meta, indent=1) indents its lines by
                # one more space (no raw newline is inside a JSON string: escaped)
                text = json.dumps(value, indent=1).replace("\n", "\n ")
                if stamp:
                    self._kept[key] = (stamp, text)
            parts.append(f" {json.dumps(key)}: {text}")
        return "{\n" + ",\n".join(parts) + "\n}"


def write_meta(run_dir: Path, meta: dict[str, Any], text: MetaText | None = None) -> None:
    """Write ``meta`` as the folder's ``run.json`` (atomically); ``text``: a writer's
    :class:`MetaText`, which keeps the text of what did not change since its last call."""
    body = text(meta) if text is not None else json.dumps(meta, indent=1)
    atomic_write_text(Path(run_dir) / "run.json", body + "\n")


def run_status(run_dir: Path) -> dict[str, Any]:
    """``{"status", "rounds_done", "rounds_planned"}`` of a run folder; a folder whose
    status says ``running`` while no process holds its lock was killed: ``interrupted``."""
    meta = read_meta(run_dir)
    status = meta.get("status")
    if status == "running" and not is_locked(run_dir):
        status = "interrupted"
    return {
        "status": status,
        "rounds_done": meta.get("rounds_done"),
        "rounds_planned": meta.get("rounds_planned"),
    }


def status_line(status: str | None, done: int | None, planned: int | None) -> str:
    """``interrupted after 6 of 12 rounds`` (or ``finished: 12 rounds``)."""
    if status == "finished":
        return f"finished: {done} rounds"
    if status in ("interrupted", "cancelled", "failed"):
        return f"{status} after {done} of {planned} rounds"
    if status == "running":
        return f"running: {done} of {planned} rounds done"
    return "status unknown (written before run.json had a status)"


@dataclass
class ResumeTarget:
    scenario: Scenario
    run_id: str
    run_dir: Path
    rounds_done: int
    lock: RunLock
    point: ResumePoint


def _cut_csv(
    path: Path, rounds_done: int, column: str = "round", first: int = 0
) -> list[dict[str, str]]:
    """Keep the header and the rows of rounds < ``rounds_done`` (a row cut short by a
    kill is dropped); returns the kept rows. ``column`` holds the round, counted from
    ``first`` (an asynchronous run's ``updates.csv``: ``version``, from 1)."""
    if not path.exists() or path.stat().st_size == 0:
        return []
    with path.open(newline="") as f:
        text = f.read()
    lines = text.splitlines(keepends=True)
    if not lines:
        return []
    header = next(csv.reader([lines[0]]))
    if column not in header:
        raise RunFolderError(f"{path}: no {column!r} column; not a mecsim record")
    i_round = header.index(column)
    kept_lines, kept = [lines[0]], []
    for line in lines[1:]:
        if not line.endswith("\n"):
            break  # the last row, cut short by the kill
        cells = next(csv.reader([line]))
        if len(cells) != len(header):
            break
        try:
            rnd = int(cells[i_round]) - first
        except ValueError:
            break
        if rnd < rounds_done:
            kept_lines.append(line)
            kept.append(dict(zip(header, cells, strict=True)))
    if len(kept_lines) != len(lines):
        atomic_write_text(path, "".join(kept_lines))
    return kept


def _cut_jsonl(path: Path, rounds_done: int) -> None:
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        try:
            rnd = int(json.loads(line)["round"])
        except (ValueError, KeyError, TypeError):
            break
        if rnd < rounds_done:
            kept.append(line)
    atomic_write_text(path, "".join(kept))


def _check_records(run_dir: Path, meta: dict[str, Any], clients: int, clocked: bool) -> None:
    """The folder's records as :mod:`mecsim.store.reader` reads them: a tampered file,
    or one of a newer version, is refused before the resume changes anything."""
    check_scenario(run_dir, meta, clients)
    for name, checks, required in (
        ("rounds.csv", ROUND_CHECKS, ROUND_REQUIRED),
        ("clients.csv", CLIENT_CHECKS, CLIENT_REQUIRED),
    ):
        path = run_dir / name
        try:
            if b"\n" not in path.read_bytes():  # none, or killed before its header was whole
                continue
        except FileNotFoundError:
            continue
        frame = read_table(path, checks, required)
        if name == "rounds.csv":
            check_rounds_in_order(path, frame)
        else:
            check_client_rows(path, frame, clients)
    if (run_dir / "optraces.jsonl").exists() and not clocked:  # (per update: docs/async.md)
        read_traces(run_dir / "optraces.jsonl", clients)


def prepare_resume(
    run_dir: str | Path,
    warn: Callable[[str], None] | None = None,
    *,
    keep_finished_lock: bool = False,
) -> ResumeTarget:
    """Lock ``run_dir``, choose its checkpoint and cut its records back to it.

    Raises :class:`RunFolderError` for a folder that is not a run, is in use, or is
    already finished (:class:`RunFolderFinished`, holding the lock when
    ``keep_finished_lock``).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunFolderError(f"{run_dir}: not a run folder (no such directory)")
    if not (run_dir / "scenario.yaml").is_file() or not (run_dir / "run.json").is_file():
        raise RunFolderError(
            f"{run_dir}: not a run folder written by `mecsim run` (needs "
            "scenario.yaml and run.json)"
        )
    lock = RunLock(run_dir).acquire()
    try:
        try:
            meta = read_meta(run_dir, strict=True)
        except RecordError as exc:
            raise RunFolderError(str(exc)) from None
        if meta.get("status") == "finished":
            raise RunFolderFinished(
                f"{run_dir}: the run is finished; nothing to resume",
                lock if keep_finished_lock else None,
            )
        try:
            scenario = load_recorded_scenario(run_dir / "scenario.yaml")
        except ScenarioError as exc:
            raise RunFolderError(f"{run_dir}: its scenario.yaml is not valid: {exc}") from None
        clocked = scenario.aggregation.clocked()
        try:  # every record read strictly before anything is cut (nothing half-done)
            _check_records(run_dir, meta, scenario.topology.clients, clocked)
        except RecordError as exc:
            raise RunFolderError(str(exc)) from None
        run_id = str(meta.get("run_id") or run_dir.name)
        store = CheckpointStore(
            run_dir, run_id, scenario_digest(scenario), scenario.checkpoint.keep
        )
        try:
            ckpt = store.latest(warn)
        except CheckpointError as exc:  # pragma: no cover - latest() skips bad files
            raise RunFolderError(str(exc)) from None
        done = ckpt.rounds_done if ckpt is not None else 0
        recorded = _cut_csv(run_dir / "rounds.csv", done)
        if len(recorded) < done:
            # the checkpoint is ahead of the records (they were lost): start over
            if warn is not None:
                warn(
                    f"{run_dir}: rounds.csv holds {len(recorded)} rounds but the checkpoint "
                    f"{done}; resuming from the start"
                )
            ckpt, done = None, 0
            _cut_csv(run_dir / "rounds.csv", 0)
        store.discard_after(done)
        _cut_csv(run_dir / "clients.csv", done)
        if clocked:  # an update's row has the version it went into, from 1 (docs/async.md)
            _cut_csv(run_dir / "updates.csv", done, "version", first=1)
        _cut_jsonl(run_dir / "optraces.jsonl", done)
        for name in ("summary.md", "rounds.parquet", "clients.parquet", "updates.parquet"):
            (run_dir / name).unlink(missing_ok=True)
        shutil.rmtree(run_dir / "plots", ignore_errors=True)
        rows = rows_from_csv(run_dir / "rounds.csv")
        return ResumeTarget(scenario, run_id, run_dir, done, lock, ResumePoint(ckpt, rows))
    except BaseException as exc:
        if not (isinstance(exc, RunFolderFinished) and exc.lock is lock):
            lock.release()
        raise


def csv_header_ok(path: Path) -> bool:
    """Does ``path`` start with a complete header line?"""
    try:
        with path.open(newline="") as f:
            first = f.readline()
    except (OSError, ValueError):  # not text (UnicodeDecodeError): no header
        return False
    return first.endswith("\n") and bool(next(csv.reader(io.StringIO(first)), []))
