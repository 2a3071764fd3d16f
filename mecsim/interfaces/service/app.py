"""The HTTP API of ``mecsim serve`` (FastAPI): runs, records, sweeps, metrics, health.

:func:`create_app` builds the application around a :class:`~mecsim.interfaces.service.store.Store`;
its lifespan recovers runs a dead server left ``running``, starts the
:class:`~mecsim.interfaces.service.worker.Worker` (one Ray for the server's life) and the sweep
thread, and stops them on shutdown. The endpoints are listed in ``docs/service.md``;
``/openapi.json`` and ``/docs`` describe them too.

Security, in the order a request meets it:

- request bodies above ``max_body_bytes`` get 413 (by ``Content-Length`` or while read);
- a server on loopback accepts only loopback ``Host`` names (no DNS rebinding), and a
  ``POST``/``DELETE`` whose ``Origin`` is another site gets 403 (no cross-site forms);
- with a token, every endpoint but ``/healthz`` and ``/metrics`` needs
  ``Authorization: Bearer <token>`` (compared in constant time), else 401;
- submitted scenarios are validated as ``mecsim validate`` does and confined to the
  data root (:mod:`mecsim.interfaces.service.submission`); the number of waiting runs is bounded
  (429 beyond it); run ids are made by the server and only ``[a-z0-9-]`` ids are looked up.
"""

from __future__ import annotations

import asyncio
import hmac
import io
import json
import math
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Literal

import pandas as pd
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool
from starlette.responses import StreamingResponse

import mecsim
from mecsim.interfaces.service.monitoring import RunSeries, service_registry
from mecsim.interfaces.service.schemas import (
    ID_PATTERN,
    PLOT_PATTERN,
    FileEntry,
    HistoryEntry,
    Message,
    Problems,
    RunList,
    RunRequest,
    RunView,
    Submitted,
    SweepRequest,
    SweepView,
)
from mecsim.interfaces.service.security import BEARER, _BodyLimit, _SameSite, is_loopback
from mecsim.interfaces.service.store import STATUSES, TERMINAL, QueueFull, Run, Store
from mecsim.interfaces.service.submission import Rejected, prepare_submission
from mecsim.interfaces.service.sweeps import SweepRunner, check_sweep, new_sweep_id
from mecsim.interfaces.service.worker import Worker

MiB = 1024 * 1024


@dataclass
class ServiceConfig:
    state_dir: Path = Path("mecsim-state")
    host: str = "127.0.0.1"
    port: int = 8470
    workers: int = 1
    ray_address: str | None = None
    token: str | None = None
    data_root: Path | None = None
    max_body_bytes: int = MiB
    max_queued: int = 100
    metrics_retention_s: float = 3600.0
    shutdown_timeout_s: float = 60.0
    #: False: the API without workers (nothing queued ever runs): tests of the HTTP layer
    start_workers: bool = True


def _record_file(base: Path, path: Path) -> bool:
    """A run's record (not a checkpoint, its lock or a file being written)."""
    parts = path.relative_to(base).parts
    return parts[0] != "checkpoints" and not any(p.startswith(".") for p in parts)


def _when(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, tz=timezone.utc)


def _plots(store: Store, run_id: str) -> list[str]:
    d = store.run_dir(run_id) / "plots"
    return sorted(p.stem for p in d.glob("*.png")) if d.is_dir() else []


def run_view(store: Store, run: Run, request: Request) -> RunView:
    return RunView(
        id=run.id, url=str(request.url_for("get_run", run_id=run.id)), name=run.name,
        algorithm=run.algorithm, status=run.status, submitted_at=_when(run.submitted_at),
        started_at=_when(run.started_at), finished_at=_when(run.finished_at),
        rounds_done=run.rounds_done, rounds_planned=run.rounds_planned,
        last_round=store.last_round(run.id), best_accuracy=run.best_accuracy,
        emulated_s=run.emulated_s, eta_s=run.eta_s, error=run.error, attempts=run.attempts,
        cancel_requested=run.cancel_requested, plots=_plots(store, run.id),
        history=[HistoryEntry(status=h["status"], at=_when(h["at"]), note=h.get("note"))
                 for h in run.history])


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


def _records(store: Store, run: Run, name: str) -> pd.DataFrame:
    frame = read_records(store, run, name)
    if frame is None:
        raise HTTPException(409, f"run {run.id} is {run.status} and has no finished round")
    return frame


def _format(request: Request, fmt: str | None) -> str:
    if fmt:
        return fmt
    accept = request.headers.get("accept", "")
    if "parquet" in accept:
        return "parquet"
    if "text/csv" in accept:
        return "csv"
    return "json"


def _table(frame: pd.DataFrame, fmt: str, name: str) -> Response:
    if fmt == "csv":
        return Response(frame.to_csv(index=False), media_type="text/csv; charset=utf-8")
    if fmt == "parquet":
        buf = io.BytesIO()
        frame.to_parquet(buf, index=False)
        return Response(buf.getvalue(), media_type="application/vnd.apache.parquet",
                        headers={"Content-Disposition": f'attachment; filename="{name}.parquet"'})
    return Response(frame.to_json(orient="records"), media_type="application/json")


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def create_app(config: ServiceConfig, store: Store | None = None) -> FastAPI:
    """The service application; ``store`` defaults to one opened on ``config.state_dir``."""
    store = store or Store(config.state_dir)
    series = RunSeries(config.metrics_retention_s)
    worker = Worker(store, workers=config.workers, ray_address=config.ray_address,
                    exporter=series.exporter, on_finished=series.finished,
                    shutdown_timeout_s=config.shutdown_timeout_s)
    sweeps = SweepRunner(store)
    registry = service_registry(store, config.workers, lambda: len(worker.busy),
                                lambda: worker.ready, lambda: len(series))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store.recover()
        if config.start_workers:
            worker.start()
            sweeps.start()

        async def expire() -> None:
            while True:
                await asyncio.sleep(1.0)
                series.expire()

        task = asyncio.create_task(expire())
        try:
            yield
        finally:
            task.cancel()
            if config.start_workers:
                await run_in_threadpool(worker.stop)
                await run_in_threadpool(sweeps.stop)

    app = FastAPI(title="mecsim service", version=mecsim.__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url=None,
                  description="Queued mecsim runs, their records, what-if sweeps and one "
                  "Prometheus target. See docs/service.md.")
    app.state.store = store
    app.state.worker = worker
    app.state.config = config
    app.state.series = series
    app.add_middleware(_SameSite, check_host=is_loopback(config.host))
    app.add_middleware(_BodyLimit, max_bytes=config.max_body_bytes)

    async def authorised(creds: Annotated[HTTPAuthorizationCredentials | None,
                                    Depends(BEARER)]) -> None:
        if config.token is None:
            return
        given = creds.credentials if creds is not None else ""
        if creds is None or not hmac.compare_digest(given.encode(), config.token.encode()):
            raise HTTPException(401, "missing or wrong bearer token",
                                headers={"WWW-Authenticate": "Bearer"})

    api = APIRouter(dependencies=[Depends(authorised)],
                    responses={401: {"model": Message, "description": "missing or wrong "
                                     "token (servers started with --token-file)"}})

    def get_run_or_404(run_id: str) -> Run:
        run = store.get_run(run_id) if re.match(ID_PATTERN, run_id) else None
        if run is None:
            raise HTTPException(404, f"no run {run_id!r}")
        return run

    # ------------------------------------------------------------------ runs

    @api.post("/runs", status_code=201, response_model=Submitted,
              responses={422: {"model": Problems, "description": "an invalid scenario: one "
                               "entry per problem, naming the field; nothing is queued"},
                         429: {"model": Message, "description": "the queue is full"},
                         413: {"model": Message, "description": "body too large"}})
    def submit(body: RunRequest, request: Request) -> JSONResponse:
        """Queue a run of a scenario (validated as `mecsim validate` does)."""
        try:
            run_id, scenario = prepare_submission(
                body.scenario, rounds=body.rounds, overrides=body.set,
                data_root=config.data_root, tmp_dir=store.tmp_dir, runs_dir=store.runs_dir)
        except Rejected as exc:
            return JSONResponse({"detail": [{"field": p.field, "msg": p.msg}
                                            for p in exc.problems]}, status_code=422)
        from mecsim.scenario import resolved_yaml

        try:
            run = store.add_run(run_id, scenario.name, scenario.algorithm.name,
                                resolved_yaml(scenario), scenario.rounds, config.max_queued)
        except QueueFull as exc:
            return JSONResponse({"detail": str(exc)}, status_code=429,
                                headers={"Retry-After": "30"})
        worker.wake()
        url = str(request.url_for("get_run", run_id=run.id))
        return JSONResponse({"id": run.id, "url": url, "status": run.status},
                            status_code=201, headers={"Location": url})

    @api.get("/runs", response_model=RunList)
    def list_runs(request: Request,
                  status: Annotated[list[Literal[STATUSES]] | None,  # type: ignore[valid-type]
                                    Query(description="only runs with these statuses")] = None,
                  limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                  offset: Annotated[int, Query(ge=0, le=10**9)] = 0) -> RunList:
        """Runs, newest first."""
        runs, total = store.list_runs(list(status or []), limit, offset)
        return RunList(runs=[run_view(store, r, request) for r in runs], total=total,
                       limit=limit, offset=offset)

    @api.get("/runs/{run_id}", response_model=RunView,
             responses={404: {"model": Message}})
    async def get_run(run_id: str, request: Request) -> RunView:
        """A run's status, progress, last round's figures and ETA."""
        return run_view(store, get_run_or_404(run_id), request)

    @api.delete("/runs/{run_id}", response_model=RunView,
                responses={404: {"model": Message},
                           409: {"model": Message, "description": "the run has ended"},
                           202: {"model": RunView, "description": "a running run: it stops "
                                 "at the end of its current round"}})
    def cancel_run(run_id: str, request: Request) -> JSONResponse:
        """Cancel: a waiting run leaves the queue; a running one stops after its round."""
        get_run_or_404(run_id)
        outcome = store.request_cancel(run_id)
        run = get_run_or_404(run_id)
        if outcome == "ended":
            raise HTTPException(409, f"run {run_id} is {run.status}")
        view = run_view(store, run, request)
        return JSONResponse(json.loads(view.model_dump_json()),
                            status_code=202 if outcome == "stopping" else 200)

    @api.get("/runs/{run_id}/rounds", responses={
        200: {"content": {"text/csv": {}, "application/vnd.apache.parquet": {}},
              "description": "one row per round (rounds.csv)"},
        404: {"model": Message}, 409: {"model": Message}})
    def rounds(run_id: str, request: Request,
               format: Literal["csv", "json", "parquet"] | None = None) -> Response:
        """rounds.csv as CSV, JSON or Parquet (``?format=`` or ``Accept``)."""
        run = get_run_or_404(run_id)
        return _table(_records(store, run, "rounds"), _format(request, format), "rounds")

    @api.get("/runs/{run_id}/clients", responses={
        200: {"content": {"text/csv": {}, "application/vnd.apache.parquet": {}},
              "description": "one row per client-round (clients.csv)"},
        404: {"model": Message}, 409: {"model": Message}})
    def clients(run_id: str, request: Request,
                format: Literal["csv", "json", "parquet"] | None = None) -> Response:
        """clients.csv as CSV, JSON or Parquet (``?format=`` or ``Accept``)."""
        run = get_run_or_404(run_id)
        return _table(_records(store, run, "clients"), _format(request, format), "clients")

    @api.get("/runs/{run_id}/summary", responses={
        200: {"content": {"text/markdown": {}}}, 404: {"model": Message},
        409: {"model": Message}})
    def summary(run_id: str) -> Response:
        """The run's summary tables (markdown); for a running run, over its rounds so far."""
        run = get_run_or_404(run_id)
        done = store.run_dir(run.id) / "summary.md"
        if done.exists() and run.status in TERMINAL:
            text = done.read_text()
        else:
            import yaml

            from mecsim.analysis.summary import markdown, summarise, target_lines
            from mecsim.scenario import scenario_from_dict

            rows = _records(store, run, "rounds").to_dict("records")
            if not rows:
                raise HTTPException(409, f"run {run.id} has no finished round yet")
            sc = scenario_from_dict(yaml.safe_load(run.scenario_yaml), run.id)
            text = markdown(run.id, run.algorithm, summarise(rows),
                            target_lines(rows, sc.evaluation.target_accuracy))
        return Response(text, media_type="text/markdown; charset=utf-8")

    @api.get("/runs/{run_id}/plots/{name}.png", responses={
        200: {"content": {"image/png": {}}}, 404: {"model": Message}})
    def plot(run_id: str, name: str) -> FileResponse:
        """One of the run's figures (``plots`` in the run's status lists them)."""
        run = get_run_or_404(run_id)
        path = store.run_dir(run.id) / "plots" / f"{name}.png"
        if not re.match(PLOT_PATTERN, name) or not path.is_file():
            raise HTTPException(404, f"run {run.id} has no plot {name!r}")
        return FileResponse(path, media_type="image/png")

    @api.get("/runs/{run_id}/scenario", responses={
        200: {"content": {"application/yaml": {}}}, 404: {"model": Message}})
    def scenario(run_id: str) -> Response:
        """The resolved scenario the run executes (every default filled in), as YAML."""
        run = get_run_or_404(run_id)
        return Response(run.scenario_yaml, media_type="application/yaml")

    @api.get("/runs/{run_id}/events", responses={
        200: {"content": {"text/event-stream": {}}}, 404: {"model": Message}})
    async def events(run_id: str, request: Request) -> StreamingResponse:
        """Server-sent events: ``round`` per finished round (its row; ``id`` is the round),
        then ``end`` with the final status. ``Last-Event-ID`` resumes after that round."""
        run = await run_in_threadpool(get_run_or_404, run_id)
        try:
            after = int(request.headers.get("last-event-id", "-1"))
        except ValueError:
            after = -1

        async def stream() -> AsyncIterator[str]:
            nonlocal after
            idle = 0.0
            while True:
                current = await run_in_threadpool(store.get_run, run.id)
                rows = await run_in_threadpool(store.rounds, run.id, after)
                for row in rows:
                    after = int(row["round"])
                    yield f"id: {after}\nevent: round\ndata: {json.dumps(row)}\n\n"
                    idle = 0.0
                if current is None or current.status in TERMINAL:
                    end = {"status": current.status if current else "deleted",
                           "rounds_done": current.rounds_done if current else 0,
                           "error": current.error if current else None}
                    yield f"event: end\ndata: {json.dumps(end)}\n\n"
                    return
                if await request.is_disconnected():
                    return
                await asyncio.sleep(0.25)
                idle += 0.25
                if idle >= 15:
                    idle = 0.0
                    yield ": keep-alive\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    @api.get("/runs/{run_id}/files", response_model=list[FileEntry],
             responses={404: {"model": Message}})
    def files(run_id: str) -> list[FileEntry]:
        """Every record file of the run's folder (what ``mecsim fetch`` downloads): not its
        checkpoints, lock or temporary files."""
        run = get_run_or_404(run_id)
        base = store.run_dir(run.id)
        if not base.is_dir():
            return []
        return [FileEntry(name=p.relative_to(base).as_posix(), bytes=p.stat().st_size)
                for p in sorted(base.rglob("*")) if p.is_file() and _record_file(base, p)]

    @api.get("/runs/{run_id}/files/{name:path}",
             responses={404: {"model": Message}})
    def file(run_id: str, name: str) -> FileResponse:
        """One file of the run's folder."""
        run = get_run_or_404(run_id)
        base = store.run_dir(run.id).resolve()
        path = (base / name).resolve()
        if not path.is_relative_to(base) or not path.is_file() or not _record_file(base, path):
            raise HTTPException(404, f"run {run.id} has no file {name!r}")
        return FileResponse(path)

    # ------------------------------------------------------------------ sweeps

    def sweep_view(sweep_id: str, request: Request) -> SweepView:
        entry = store.get_sweep(sweep_id) if re.match(ID_PATTERN, sweep_id) else None
        if entry is None:
            raise HTTPException(404, f"no sweep {sweep_id!r}")
        table = None
        csv = store.sweep_dir(entry.id) / "sweep.csv"
        if entry.status == "finished" and csv.exists():
            frame = pd.read_csv(csv)
            table = [{k: _json_safe(v) for k, v in row.items()}
                     for row in json.loads(frame.to_json(orient="records"))]
        req = entry.request
        return SweepView(id=entry.id, url=str(request.url_for("get_sweep", sweep_id=entry.id)),
                         status=entry.status, created_at=_when(entry.created_at),
                         finished_at=_when(entry.finished_at), runs=req["runs"],
                         set=req["set"], metric=req["metric"],
                         target_accuracy=req.get("target_accuracy"), error=entry.error,
                         table=table)

    @api.post("/sweeps", status_code=202, response_model=SweepView,
              responses={422: {"model": Problems}})
    def submit_sweep(body: SweepRequest, request: Request) -> JSONResponse:
        """Queue a what-if sweep (replay without training) over finished runs."""
        try:
            check_sweep(store, body.runs, body.set, body.metric, body.target_accuracy,
                        config.data_root)
        except Rejected as exc:
            return JSONResponse({"detail": [{"field": p.field, "msg": p.msg}
                                            for p in exc.problems]}, status_code=422)
        sweep_id = new_sweep_id()
        store.add_sweep(sweep_id, body.model_dump())
        sweeps.wake()
        view = sweep_view(sweep_id, request)
        return JSONResponse(json.loads(view.model_dump_json()), status_code=202,
                            headers={"Location": view.url})

    @api.get("/sweeps/{sweep_id}", response_model=SweepView,
             responses={404: {"model": Message}})
    def get_sweep(sweep_id: str, request: Request) -> SweepView:
        """A sweep's status and, once finished, its table (one row per run and point)."""
        return sweep_view(sweep_id, request)

    @api.get("/sweeps/{sweep_id}/plot.png", responses={
        200: {"content": {"image/png": {}}}, 404: {"model": Message}})
    def sweep_plot(sweep_id: str) -> FileResponse:
        """The sweep's plot: its metric against the first grid path."""
        entry = store.get_sweep(sweep_id) if re.match(ID_PATTERN, sweep_id) else None
        path = store.sweep_dir(sweep_id) / "sweep.png" if entry else None
        if path is None or not path.is_file():
            raise HTTPException(404, f"no plot for sweep {sweep_id!r}")
        return FileResponse(path, media_type="image/png")

    # ------------------------------------------------------------------ service

    @api.get("/readyz", responses={503: {"model": Message}})
    def readyz() -> JSONResponse:
        """200 once the service's Ray is up and workers take runs; 503 before (or if Ray
        failed to start: the reason)."""
        if worker.ready:
            return JSONResponse({"ready": True, "workers": config.workers,
                                 "busy": len(worker.busy)})
        reason = worker.ray_error or ("not taking runs (started without workers)"
                                      if not config.start_workers else "starting Ray")
        return JSONResponse({"ready": False, "detail": reason}, status_code=503)

    @api.get("/openapi.json", include_in_schema=False)
    def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @api.get("/docs", include_in_schema=False)
    def docs():
        return get_swagger_ui_html(openapi_url="/openapi.json", title="mecsim service")

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> Response:
        return Response(status_code=204)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """200 while the server answers (no token needed)."""
        return {"status": "ok"}

    @app.get("/metrics",
             responses={200: {"content": {"text/plain": {}}}})
    def metrics() -> Response:
        """Prometheus: every retained run's series and the service's (no token needed)."""
        page = series.render() + generate_latest(registry).decode()
        return Response(page, media_type=CONTENT_TYPE_LATEST)

    from mecsim.interfaces.service.web import web_router

    app.include_router(api)
    app.include_router(web_router(store, config, authorised, submit_form=_submit_for_web(
        store, config, worker)), include_in_schema=False)
    return app


def _submit_for_web(store: Store, config: ServiceConfig, worker: Worker):
    """The web form's submission: the same checks as ``POST /runs``."""
    from mecsim.scenario import resolved_yaml

    def submit(text: str, rounds: int | None, overrides: dict[str, Any]) -> Run:
        run_id, scenario = prepare_submission(
            text, rounds=rounds, overrides=overrides, data_root=config.data_root,
            tmp_dir=store.tmp_dir, runs_dir=store.runs_dir)
        run = store.add_run(run_id, scenario.name, scenario.algorithm.name,
                            resolved_yaml(scenario), scenario.rounds, config.max_queued)
        worker.wake()
        return run

    return submit
