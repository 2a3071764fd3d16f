"""Run records in ``runs/<run-id>/``, written as each round ends.

- ``scenario.yaml``: the resolved scenario (every default filled in);
- ``run.json``: the run's status (running, finished, interrupted, cancelled, failed),
  rounds done and planned, model size, hosts, resumes and recovered faults, and where
  the host actors ran (``placement``: an entry each time they were started);
- ``rounds.csv`` / ``clients.csv``: one row per round / per client-round; the header is
  fsync'ed when the run starts and the rows at the end of every round, so a killed run
  keeps every finished round (``mecsim run --resume`` continues it). An asynchronous
  run (``updates.csv`` in place of ``clients.csv``) ends a version every update or few:
  its rows reach the OS at every version's end (a killed process loses none of them),
  and are fsync'ed at least every :data:`SYNC_EVERY_S` seconds, before every
  checkpoint (which refers to them: what a resume needs is on disk before the
  checkpoint that needs it) and at the end, not after every version (an fsync per
  version was 27 of 168 s of a 10,000-client run); ``run.json`` (``rounds_done``) is
  rewritten with each of those fsyncs, so it may be up to that long behind the rows (a
  rename over it costs ~10 ms on ext4, which flushes the new file's data first);
- ``optraces.jsonl``: one line per round with every client's op-trace and the server's
  aggregation FLOPs (what a replay needs);
- at the end (also of an interrupted run): ``rounds.parquet`` / ``clients.parquet`` (when
  ``outputs.table_format`` is parquet) and ``summary.md`` with the tables, each written
  to a temporary name and renamed into place;
- ``checkpoints/round-NNNNNN.pt``: see :mod:`mecsim.store.checkpoints`.
"""

from __future__ import annotations

import csv
import io
import json
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from mecsim.agents.algorithms import algorithm_classes
from mecsim.emulation.network import client_record_keys, round_record_keys
from mecsim.run.async_rows import ASYNC_ROUND_COLUMNS, UPDATE_COLUMNS
from mecsim.run.chaos import kill_point
from mecsim.run.interrupts import atomic_section
from mecsim.run.observers import RunInfo, RunObserver
from mecsim.run.rows import CLIENT_COLUMNS, ROUND_COLUMNS
from mecsim.scenario import resolved_yaml
from mecsim.store.files import atomic_write_text
from mecsim.store.reader import (
    RECORDS_FORMAT,
    read_csv_exact,
    read_meta,
    rows_from_csv,
    scenario_sha256,
)
from mecsim.store.runfolder import (
    LOCK_NAME,
    MetaText,
    RunFolderError,
    csv_header_ok,
    status_line,
    write_meta,
)
from mecsim.store.summary import markdown, run_notes, summarise, target_lines

#: An asynchronous run's records are fsync'ed at least this often (wall seconds), and
#: before every checkpoint and at the end (the module's docstring).
SYNC_EVERY_S = 1.0


class _AppendCsv:
    """A CSV file whose header is on disk (fsync'ed) before any row, and whose rows are
    fsync'ed as each round ends (or, ``sync=False``, only flushed to the OS until
    :meth:`sync` or :meth:`close`)."""

    def __init__(self, path: Path, columns: list[str], append: bool = False) -> None:
        self.path = path
        fresh = not append or not csv_header_ok(path)
        self.added: list[str] = []  # columns this version added to a resumed file
        if not fresh:
            with path.open(newline="") as f:
                header = next(csv.reader(f))
            if header != columns:
                self.added = _add_columns(path, header, columns)
        self.file = path.open("w" if fresh else "a", newline="")
        self.writer = csv.DictWriter(self.file, fieldnames=columns, restval="")
        self.unsynced = False  # rows flushed to the OS, not yet fsync'ed
        if fresh:
            self.writer.writeheader()
            self.sync()

    def sync(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.unsynced = False

    def append(self, rows: list[dict[str, Any]], sync: bool = True) -> None:
        self.writer.writerows(rows)
        if sync:
            self.sync()
        else:
            self.file.flush()
            self.unsynced = True

    def close(self) -> None:
        if self.unsynced:
            self.sync()
        self.file.close()


def _add_columns(path: Path, header: list[str], columns: list[str]) -> list[str]:
    """Rewrite ``path`` (atomically) with this version's ``columns`` when they are its
    ``header`` with columns added (records grew a column since the run was written:
    ``energy_sleep_j``, say); the rows written before hold an empty value there, as a
    value that was not recorded. Columns removed, renamed or reordered: refused."""
    if [c for c in columns if c in header] != header:
        raise RunFolderError(
            f"{path}: its columns differ from this mecsim's; the run "
            "was written by another version and cannot be resumed"
        )
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=columns, restval="")
    writer.writeheader()
    writer.writerows(rows)
    with atomic_section():  # the old file or the new one, never half of either
        atomic_write_text(path, text.getvalue())
    return [c for c in columns if c not in header]


def _versions() -> dict[str, str]:
    """What a run or a resume ran on: mecsim's (its installed distribution's), Python's,
    PyTorch's and numpy's versions."""
    import numpy
    import torch  # already imported by the run (its models); not by this module's readers

    try:
        mecsim_version = metadata.version("mecsim")
    except metadata.PackageNotFoundError:  # a source tree that is not installed
        mecsim_version = "unknown"
    return {
        "mecsim_version": mecsim_version,
        "python_version": platform.python_version(),
        "torch_version": str(torch.__version__),
        "numpy_version": numpy.__version__,
    }


def _plugin_key(info: dict[str, Any]) -> tuple[str, str]:
    return (str(info.get("kind")), str(info.get("name")))


def _plugin_source(info: dict[str, Any]) -> str:
    """A plugin as a person tells versions apart: a file's sha256, a package's version."""
    if info.get("sha256"):
        return f"{info.get('target')} (sha256 {str(info['sha256'])[:12]})"
    version = f" {info['version']}" if info.get("version") else ""
    return f"{info.get('target')}{version}"


def _identity(info: dict[str, Any]) -> tuple[Any, ...]:
    """A plugin file is its content (the same file under another path is the same
    plugin); anything else its import string, distribution and version."""
    if info.get("sha256"):
        return ("file", info["sha256"])
    return (info.get("target"), info.get("distribution"), info.get("version"))


def _changed_plugins(meta: dict[str, Any], plugins: list[dict[str, Any]]) -> list[str]:
    """One line per plugin a resume runs from another file or version than the rounds
    before it did (the last resume's, else the run's start), or that it adds or drops."""
    before = meta.get("plugins") or []
    for entry in meta.get("resumes") or []:
        if isinstance(entry, dict) and isinstance(entry.get("plugins"), list):
            before = entry["plugins"]
    old = {_plugin_key(i): i for i in before if isinstance(i, dict)}
    new = {_plugin_key(i): i for i in plugins}
    lines = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        what = f"{key[0]} {key[1]!r}"
        if a is None or b is None:
            lines.append(
                f"{what}: {'not used' if a is None else _plugin_source(a)} before the "
                f"resume, {'not used' if b is None else _plugin_source(b)} from it on"
            )
        elif _identity(a) != _identity(b):
            lines.append(
                f"{what} changed at the resume: {_plugin_source(a)} before, "
                f"{_plugin_source(b)} from it on (run.json records both)"
            )
    return lines


class RecordsWriter(RunObserver):
    """Writes a run's records; ``run.json`` follows its status round by round."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = Path(out_dir)
        self.summary: dict[str, float] | None = None
        self.meta: dict[str, Any] = {}
        self._meta_text = MetaText()  # run.json rewritten every round: keeps what did not change
        self._open = False
        # an asynchronous run's records are fsync'ed every SYNC_EVERY_S seconds (and before
        # a checkpoint), a synchronous run's at every round's end
        self._sync_every_s = 0.0
        self._synced_at = 0.0
        self._traces_unsynced = False

    # -- start -----------------------------------------------------------------------
    def _open_files(self, info: RunInfo, append: bool) -> None:

        sc = info.scenario
        server_cls, _ = algorithm_classes(sc.algorithm.name)
        # a hierarchical algorithm whose clients move: the client state moved at handovers
        moved = ["handover_bytes"] if server_cls.Edge is not None and round_record_keys(sc) else []
        if sc.aggregation.clocked():  # one row per version, and per update (docs/async.md)
            self.rounds = _AppendCsv(self.out_dir / "rounds.csv", ASYNC_ROUND_COLUMNS, append)
            self.clients = _AppendCsv(self.out_dir / "updates.csv", UPDATE_COLUMNS, append)
        else:
            self.rounds = _AppendCsv(
                self.out_dir / "rounds.csv",
                ROUND_COLUMNS
                + list(server_cls.round_metrics)
                + list(round_record_keys(sc))
                + moved,
                append,
            )
            self.clients = _AppendCsv(
                self.out_dir / "clients.csv",
                CLIENT_COLUMNS + list(client_record_keys(sc)) + moved,
                append,
            )
        self.traces = (
            (self.out_dir / "optraces.jsonl").open("a" if append else "w")
            if sc.outputs.save_optraces
            else None
        )
        self._sync_every_s = SYNC_EVERY_S if sc.aggregation.clocked() else 0.0
        self._synced_at = time.monotonic()
        self._open = True

    def _write_meta(self, **changes: Any) -> None:
        self.meta.update(changes, updated_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        write_meta(self.out_dir, self.meta, self._meta_text)

    def _sync(self) -> None:
        """Every row written so far on disk (fsync'ed)."""
        for table in (self.clients, self.rounds):
            if table.unsynced:
                table.sync()
        if self.traces is not None and self._traces_unsynced:
            os.fsync(self.traces.fileno())
            self._traces_unsynced = False
        self._synced_at = time.monotonic()

    def on_run_start(self, info: RunInfo) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if any(p.name != LOCK_NAME for p in self.out_dir.iterdir()):
            raise FileExistsError(f"{self.out_dir}: not empty; records go to a new folder")
        sc = info.scenario
        scenario_text = resolved_yaml(sc)
        atomic_write_text(self.out_dir / "scenario.yaml", scenario_text)
        self._open_files(info, append=False)
        self.meta = {
            # what readers check the folder against (mecsim.store.reader)
            "records_format": RECORDS_FORMAT,
            "scenario_sha256": scenario_sha256(scenario_text),
            "run_id": info.run_id,
            "status": "running",
            "rounds_done": 0,
            "rounds_planned": sc.rounds,
            "pid": os.getpid(),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "num_params": info.num_params,
            "model_bytes": info.model_nbytes,
            "step_memory_bytes": info.step_memory_bytes,
            "step_flops": info.step_flops,
            "client_devices": info.client_devices,
            "resumes": [],
            "faults": [],
            **info.extra,
            **_versions(),
        }
        self._write_meta()

    def on_run_resume(self, info: RunInfo, rounds: list[dict[str, Any]]) -> None:
        self._open_files(info, append=True)
        added = {f.path.name: f.added for f in (self.rounds, self.clients) if f.added}
        self.meta = read_meta(self.out_dir) or {"run_id": info.run_id}
        plugins = list(info.extra.get("plugins") or [])
        changed = _changed_plugins(self.meta, plugins)
        for line in changed:
            print(f"mecsim: warning: {line}", file=sys.stderr)
        resumes = list(self.meta.get("resumes", [])) + [
            {
                "from_round": len(rounds),
                "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "pid": os.getpid(),
                # what this process ran the rounds from here on with: the plugins (a
                # file's sha256, a package's version), mecsim's and the libraries'
                # versions, the backend and hosts (a resume may change any of them)
                "plugins": plugins,
                **({"plugins_changed": changed} if changed else {}),
                **_versions(),
                "backend": info.extra.get("backend"),
                "hosts": info.extra.get("hosts"),
                # columns this version records that the rounds before did not
                **({"added_columns": added} if added else {}),
                # the rate this process's edge server aggregates at (a replay times the
                # rounds of a run recorded before the rate existed at flops_per_s)
                **{k: info.extra[k] for k in ("aggregate_flops_per_s",) if k in info.extra},
            }
        ]
        self.meta.pop("error", None)
        self._write_meta(
            status="running",
            rounds_done=len(rounds),
            pid=os.getpid(),
            rounds_planned=info.scenario.rounds,
            resumes=resumes,
            hosts=info.extra.get("hosts"),
            backend=info.extra.get("backend"),
        )

    # -- each round ------------------------------------------------------------------
    def on_round_end(
        self,
        info: RunInfo,
        round_row: dict[str, Any],
        client_rows: list[dict[str, Any]],
        traces: dict[str, Any],
    ) -> None:
        with atomic_section():  # an interrupt waits until the round is on disk
            # (an asynchronous run's version: with the OS, fsync'ed every SYNC_EVERY_S s)
            due = time.monotonic() - self._synced_at >= self._sync_every_s
            self.clients.append(client_rows, sync=False)
            self.rounds.append([round_row], sync=False)
            if self.traces is not None:
                self.traces.write(json.dumps(traces) + "\n")
                self.traces.flush()
                self._traces_unsynced = True
            done = int(round_row["round"]) + 1
            if due:
                self._sync()
                self._write_meta(rounds_done=done)
            else:  # written with the next sync, checkpoint or the run's end
                self.meta["rounds_done"] = done

    def on_checkpoint_start(self, info: RunInfo, rounds_done: int) -> None:
        self._sync()  # the checkpoint refers to these rows: on disk before it is

    def on_checkpoint(self, info: RunInfo, rounds_done: int, nbytes: int, seconds: float) -> None:
        totals = dict(
            self.meta.get("checkpoint_totals") or {"count": 0, "bytes": 0, "seconds": 0.0}
        )
        totals = {
            "count": totals["count"] + 1,
            "bytes": totals["bytes"] + nbytes,
            "seconds": round(totals["seconds"] + seconds, 6),
        }
        self._write_meta(
            checkpoint={"rounds_done": rounds_done, "bytes": nbytes, "seconds": round(seconds, 6)},
            checkpoint_totals=totals,
        )

    def on_fault(self, info: RunInfo, rnd: int, message: str) -> None:
        faults = list(self.meta.get("faults", [])) + [{"round": rnd, "error": message}]
        self._write_meta(faults=faults)

    def on_placement(self, info: RunInfo, rnd: int, hosts: list[dict[str, Any]]) -> None:
        placement = list(self.meta.get("placement", [])) + [{"round": rnd, "hosts": hosts}]
        self._write_meta(placement=placement)

    # -- end -------------------------------------------------------------------------
    def _close(self) -> None:
        if self._open:
            self._sync()
            self.rounds.close()
            self.clients.close()
            if self.traces is not None:
                self.traces.close()
            self._open = False

    def _finish_files(self, info: RunInfo, status_text: str | None) -> None:
        """Parquet copies and summary.md, from the records on disk (so a resumed run's
        equal an uninterrupted one's), each written to a temporary name and renamed."""

        if info.scenario.outputs.table_format == "parquet":
            per_client = "updates" if info.scenario.aggregation.clocked() else "clients"
            for name in ("rounds", per_client):
                path = self.out_dir / f"{name}.parquet"
                tmp = path.with_name(f".{path.name}.tmp")
                with atomic_section():
                    read_csv_exact(self.out_dir / f"{name}.csv").to_parquet(tmp, index=False)
                    with tmp.open("rb") as f:
                        os.fsync(f.fileno())
                    os.replace(tmp, path)
                kill_point("finish")
        rows = rows_from_csv(self.out_dir / "rounds.csv")
        if not rows:
            return
        self.summary = summarise(rows)
        targets = target_lines(rows, info.scenario.evaluation.target_accuracy)
        text = markdown(
            info.run_id,
            info.scenario.algorithm.name,
            self.summary,
            targets,
            run_notes(info.scenario, rows),
        )
        if status_text:
            text = text.replace("\n\n", f"\n\n**Run {status_text}.**\n\n", 1)
        atomic_write_text(self.out_dir / "summary.md", text)

    def on_run_end(self, info: RunInfo, rounds: list[dict[str, Any]]) -> None:
        self._close()
        self._finish_files(info, None)
        self._write_meta(status="finished", rounds_done=len(rounds))

    def on_run_stopped(
        self, info: RunInfo, rounds: list[dict[str, Any]], status: str, message: str
    ) -> None:
        self._close()
        if not self.meta:  # stopped before on_run_start wrote anything
            return
        done, planned = len(rounds), info.scenario.rounds
        try:
            self._finish_files(info, status_line(status, done, planned))
        finally:
            changes: dict[str, Any] = {"status": status, "rounds_done": done}
            if message:
                changes["error"] = message
            self._write_meta(**changes)
