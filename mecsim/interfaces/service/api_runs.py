"""The service's API of runs: submit, list, status, cancel, records, figures, events.

A module-level router (:data:`router`); what an endpoint needs from the application (the
store, the configuration, the worker, the work pool, the run feeds, the run of the path)
comes as a dependency (:mod:`mecsim.interfaces.service.dependencies`). The token check is
added where the application includes the router.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

import yaml
from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response
from starlette.responses import StreamingResponse

from mecsim.interfaces.service.bounded import parse_model
from mecsim.interfaces.service.config import ServiceConfig
from mecsim.interfaces.service.dependencies import (
    ConfigDep,
    FeedsDep,
    PoolDep,
    RunDep,
    StoreDep,
    WorkerDep,
    get_run_or_404,
)
from mecsim.interfaces.service.jobs import STATUSES, TERMINAL, Run, Store
from mecsim.interfaces.service.schemas import (
    PLOT_PATTERN,
    FileEntry,
    Message,
    Problems,
    RunList,
    RunRequest,
    RunView,
    Submitted,
)
from mecsim.interfaces.service.submission import prepare_submission
from mecsim.interfaces.service.views import (
    record_file,
    records_or_409,
    run_view,
    table_format,
    table_response,
)
from mecsim.interfaces.service.worker import Worker
from mecsim.scenario import resolved_yaml, scenario_from_dict
from mecsim.store.summary import markdown, summarise, target_lines

__all__ = ["get_run_or_404", "queue_run", "router"]


def queue_run(
    store: Store,
    config: ServiceConfig,
    worker: Worker,
    scenario: Any,
    rounds: int | None,
    overrides: dict[str, Any],
) -> Run:
    """Validate a submission (as ``mecsim validate`` does, confined to the data root) and
    queue it: what ``POST /runs`` and the web form both do. Raises
    :class:`~mecsim.interfaces.service.submission.Rejected` or
    :class:`~mecsim.interfaces.service.jobs.QueueFull`."""
    run_id, sc = prepare_submission(
        scenario,
        rounds=rounds,
        overrides=overrides,
        data_root=config.data_root,
        tmp_dir=store.tmp_dir,
        runs_dir=store.runs_dir,
        limits=config.limits,
        allow_imports=config.allow_imports,
        flower_apps=config.flower_apps,
    )
    run = store.add_run(
        run_id, sc.name, sc.algorithm.name, resolved_yaml(sc), sc.rounds, config.max_queued
    )
    worker.wake()
    return run


#: The ``/runs`` endpoints (the application adds the token check when it includes them).
router = APIRouter(
    responses={
        401: {
            "model": Message,
            "description": "missing or wrong token (servers started with --token-file)",
        }
    },
)


@router.post(
    "/runs",
    status_code=201,
    response_model=Submitted,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": RunRequest.model_json_schema()}},
        }
    },
    responses={
        422: {
            "model": Problems,
            "description": "an invalid scenario, or a run above the service's limits: "
            "one entry per problem, naming the field; nothing is queued",
        },
        429: {"model": Message, "description": "the queue is full"},
        413: {"model": Message, "description": "body too large"},
        503: {"model": Message, "description": "the server is busy: retry"},
    },
)
async def submit(
    request: Request, store: StoreDep, config: ConfigDep, worker: WorkerDep, pool: PoolDep
) -> JSONResponse:
    """Queue a run of a scenario (validated as `mecsim validate` does, and checked
    against the service's limits). The body is a `RunRequest`."""
    raw = await request.body()

    def work() -> Run:
        body = parse_model(raw, RunRequest)
        return queue_run(store, config, worker, body.scenario, body.rounds, body.set)

    run = await pool.run(work)
    url = str(request.url_for("get_run", run_id=run.id))
    return JSONResponse(
        {"id": run.id, "url": url, "status": run.status},
        status_code=201,
        headers={"Location": url},
    )


@router.get("/runs", response_model=RunList)
def list_runs(
    request: Request,
    store: StoreDep,
    status: Annotated[
        list[Literal[STATUSES]] | None,  # type: ignore[valid-type]
        Query(description="only runs with these statuses"),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
) -> RunList:
    """Runs, newest first."""
    runs, total = store.list_runs(list(status or []), limit, offset)
    return RunList(
        runs=[run_view(store, r, request) for r in runs],
        total=total,
        limit=limit,
        offset=offset,
    )


@router.get("/runs/{run_id}", response_model=RunView, responses={404: {"model": Message}})
async def get_run(run: RunDep, request: Request, store: StoreDep) -> Any:
    """A run's status, progress, last round's figures and ETA; a browser (``Accept:
    text/html``) is sent to the run's web page."""
    if "text/html" in request.headers.get("accept", ""):
        return RedirectResponse(f"/ui/runs/{run.id}", status_code=303)
    return run_view(store, run, request)


@router.delete(
    "/runs/{run_id}",
    response_model=RunView,
    responses={
        404: {"model": Message},
        409: {"model": Message, "description": "the run has ended"},
        202: {
            "model": RunView,
            "description": "a running run: it stops within about a second, its round in "
            "progress discarded",
        },
    },
)
def cancel_run(run_id: str, request: Request, store: StoreDep) -> JSONResponse:
    """Cancel: a waiting run leaves the queue; a running one stops within about a second
    (a round in progress is discarded, the finished rounds kept)."""
    get_run_or_404(store, run_id)
    outcome = store.request_cancel(run_id)
    run = get_run_or_404(store, run_id)
    if outcome == "ended":
        raise HTTPException(409, f"run {run_id} is {run.status}")
    view = run_view(store, run, request)
    return JSONResponse(
        json.loads(view.model_dump_json()), status_code=202 if outcome == "stopping" else 200
    )


def _table_responses(description: str) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI responses of a records table's endpoint (CSV or Parquet; 404, 409)."""
    return {
        200: {
            "content": {"text/csv": {}, "application/vnd.apache.parquet": {}},
            "description": description,
        },
        404: {"model": Message},
        409: {"model": Message},
    }


def table(store: Store, run_id: str, kind: str, name: str) -> Response:
    """A run's rounds.csv or clients.csv as ``kind`` (read and converted in the work
    pool)."""
    run = get_run_or_404(store, run_id)
    return table_response(records_or_409(store, run, name), kind, name)


@router.get(
    "/runs/{run_id}/rounds",
    responses=_table_responses("one row per round (rounds.csv)"),
)
async def rounds(
    run_id: str,
    request: Request,
    store: StoreDep,
    pool: PoolDep,
    format: Literal["csv", "json", "parquet"] | None = None,
) -> Response:
    """rounds.csv as CSV, JSON or Parquet (``?format=`` or ``Accept``)."""
    return await pool.run(table, store, run_id, table_format(request, format), "rounds")


@router.get(
    "/runs/{run_id}/clients",
    responses=_table_responses("one row per client-round (clients.csv)"),
)
async def clients(
    run_id: str,
    request: Request,
    store: StoreDep,
    pool: PoolDep,
    format: Literal["csv", "json", "parquet"] | None = None,
) -> Response:
    """clients.csv as CSV, JSON or Parquet (``?format=`` or ``Accept``)."""
    return await pool.run(table, store, run_id, table_format(request, format), "clients")


@router.get(
    "/runs/{run_id}/summary",
    responses={
        200: {"content": {"text/markdown": {}}},
        404: {"model": Message},
        409: {"model": Message},
    },
)
async def summary(run_id: str, store: StoreDep, pool: PoolDep) -> Response:
    """The run's summary tables (markdown); for a running run, over its rounds so far."""
    return await pool.run(summary_of, store, run_id)


def summary_of(store: Store, run_id: str) -> Response:
    """The summary of ``summary``, made in the work pool."""
    run = get_run_or_404(store, run_id)
    done = store.run_dir(run.id) / "summary.md"
    if done.exists() and run.status in TERMINAL:
        text = done.read_text()
    else:
        rows = records_or_409(store, run, "rounds").to_dict("records")
        if not rows:
            raise HTTPException(409, f"run {run.id} has no finished round yet")
        sc = scenario_from_dict(yaml.safe_load(run.scenario_yaml), run.id)
        text = markdown(
            run.id,
            run.algorithm,
            summarise(rows),
            target_lines(rows, sc.evaluation.target_accuracy),
        )
    return Response(text, media_type="text/markdown; charset=utf-8")


@router.get(
    "/runs/{run_id}/plots/{name}.png",
    responses={200: {"content": {"image/png": {}}}, 404: {"model": Message}},
)
def plot(run: RunDep, name: str, store: StoreDep) -> FileResponse:
    """One of the run's figures (``plots`` in the run's status lists them)."""
    if not re.fullmatch(PLOT_PATTERN, name):
        raise HTTPException(404, f"run {run.id} has no plot {name!r}")
    base = store.run_dir(run.id).resolve()
    path = (base / "plots" / f"{name}.png").resolve()
    if not path.is_relative_to(base) or not path.is_file():  # no symlink out
        raise HTTPException(404, f"run {run.id} has no plot {name!r}")
    return FileResponse(path, media_type="image/png")


@router.get(
    "/runs/{run_id}/scenario",
    responses={200: {"content": {"application/yaml": {}}}, 404: {"model": Message}},
)
def scenario(run: RunDep) -> Response:
    """The resolved scenario the run executes (every default filled in), as YAML."""
    return Response(run.scenario_yaml, media_type="application/yaml")


@router.get(
    "/runs/{run_id}/events",
    responses={200: {"content": {"text/event-stream": {}}}, 404: {"model": Message}},
)
async def events(run: RunDep, request: Request, feeds: FeedsDep) -> StreamingResponse:
    """Server-sent events: ``round`` per finished round (its row; ``id`` is the round),
    then ``end`` with the final status. ``Last-Event-ID`` resumes after that round."""
    given = request.headers.get("last-event-id", "").strip()
    # a round number; anything else (too long, negative, not a number): from the start
    after = int(given) if re.fullmatch(r"[0-9]{1,9}", given) else -1
    return StreamingResponse(
        feeds.stream(run, after, request.is_disconnected),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache"},
    )


@router.get(
    "/runs/{run_id}/files", response_model=list[FileEntry], responses={404: {"model": Message}}
)
def files(run: RunDep, store: StoreDep) -> list[FileEntry]:
    """Every record file of the run's folder (what ``mecsim fetch`` downloads): not its
    checkpoints, lock or temporary files."""
    base = store.run_dir(run.id)
    if not base.is_dir():
        return []
    # symbolic links are not followed (nothing outside the folder is even stat'ed)
    return [
        FileEntry(name=p.relative_to(base).as_posix(), bytes=p.lstat().st_size)
        for p in sorted(base.rglob("*"))
        if not p.is_symlink() and p.is_file() and record_file(base, p)
    ]


@router.get("/runs/{run_id}/files/{name:path}", responses={404: {"model": Message}})
def file(run: RunDep, name: str, store: StoreDep) -> FileResponse:
    """One file of the run's folder."""
    if "\x00" in name or len(name) > 1000:
        raise HTTPException(404, f"run {run.id} has no such file")
    base = store.run_dir(run.id).resolve()
    try:
        path = (base / name).resolve()
        found = path.is_relative_to(base) and path.is_file() and record_file(base, path)
    except (OSError, ValueError):  # a name too long for the file system, ...
        found = False
    if not found:
        raise HTTPException(404, f"run {run.id} has no file {name[:100]!r}")
    return FileResponse(path)
