"""What the service's routes and pages show of a run: its view, its records, its files."""

from __future__ import annotations

import io
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

import pandas as pd
from fastapi import HTTPException, Request
from fastapi.responses import Response

from mecsim.interfaces.service.jobs import TERMINAL, Run, Store
from mecsim.interfaces.service.schemas import HistoryEntry, RunStatus, RunView


def record_file(base: Path, path: Path) -> bool:
    """A run's record (not a checkpoint, its lock or a file being written)."""
    parts = path.relative_to(base).parts
    return parts[0] != "checkpoints" and not any(p.startswith(".") for p in parts)


def when(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, tz=timezone.utc)


def plot_names(store: Store, run_id: str) -> list[str]:
    d = store.run_dir(run_id) / "plots"
    if d.is_symlink() or not d.is_dir():
        return []
    return sorted(p.stem for p in d.glob("*.png") if not p.is_symlink())


def run_view(store: Store, run: Run, request: Request) -> RunView:
    return RunView(
        id=run.id,
        url=str(request.url_for("get_run", run_id=run.id)),
        name=run.name,
        algorithm=run.algorithm,
        status=cast(RunStatus, run.status),
        submitted_at=datetime.fromtimestamp(run.submitted_at, tz=timezone.utc),
        started_at=when(run.started_at),
        finished_at=when(run.finished_at),
        rounds_done=run.rounds_done,
        rounds_planned=run.rounds_planned,
        last_round=store.last_round(run.id),
        best_accuracy=run.best_accuracy,
        emulated_s=run.emulated_s,
        eta_s=run.eta_s,
        error=run.error,
        attempts=run.attempts,
        cancel_requested=run.cancel_requested,
        plots=plot_names(store, run.id),
        history=[
            HistoryEntry(
                status=h["status"],
                at=datetime.fromtimestamp(h["at"], timezone.utc),
                note=h.get("note"),
            )
            for h in run.history
        ],
    )


def read_records(store: Store, run: Run, name: str) -> pd.DataFrame | None:
    """rounds.csv / clients.csv of a run up to its last finished round; None before one."""
    path = store.run_dir(run.id) / f"{name}.csv"
    if not path.exists() or (run.status not in TERMINAL and run.rounds_done == 0):
        return None
    try:
        frame = pd.read_csv(path)
    except pd.errors.EmptyDataError:  # created, header not yet written
        return None
    if run.status not in TERMINAL:  # a row being appended is not yet a finished round
        frame = frame[frame["round"] < run.rounds_done]
    return frame


def records_or_409(store: Store, run: Run, name: str) -> pd.DataFrame:
    frame = read_records(store, run, name)
    if frame is None:
        raise HTTPException(409, f"run {run.id} is {run.status} and has no finished round")
    return frame


def table_format(request: Request, fmt: str | None) -> str:
    if fmt:
        return fmt
    accept = request.headers.get("accept", "")
    if "parquet" in accept:
        return "parquet"
    if "text/csv" in accept:
        return "csv"
    return "json"


def table_response(frame: pd.DataFrame, fmt: str, name: str) -> Response:
    if fmt == "csv":
        return Response(frame.to_csv(index=False), media_type="text/csv; charset=utf-8")
    if fmt == "parquet":
        buf = io.BytesIO()
        frame.to_parquet(buf, index=False)
        return Response(
            buf.getvalue(),
            media_type="application/vnd.apache.parquet",
            headers={"Content-Disposition": f'attachment; filename="{name}.parquet"'},
        )
    return Response(frame.to_json(orient="records"), media_type="application/json")


def json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
