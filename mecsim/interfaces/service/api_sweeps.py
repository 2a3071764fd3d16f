"""The service's API of what-if sweeps over finished runs."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import pandas as pd
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import FileResponse, JSONResponse

import mecsim.registry as plugin_registry
from mecsim.interfaces.service.bounded import WorkPool, parse_model
from mecsim.interfaces.service.config import ServiceConfig
from mecsim.interfaces.service.jobs import Store
from mecsim.interfaces.service.schemas import ID_PATTERN, Message, Problems, SweepRequest, SweepView
from mecsim.interfaces.service.sweep_runner import SweepRunner, check_sweep, new_sweep_id
from mecsim.interfaces.service.views import json_safe, when


def sweeps_router(
    store: Store,
    config: ServiceConfig,
    sweeps: SweepRunner,
    authorised: Callable[..., Any],
    pool: WorkPool,
) -> APIRouter:
    """The ``/sweeps`` endpoints, behind ``authorised``."""
    api = APIRouter(
        dependencies=[Depends(authorised)],
        responses={
            401: {
                "model": Message,
                "description": "missing or wrong token (servers started with --token-file)",
            }
        },
    )

    def sweep_view(sweep_id: str, request: Request) -> SweepView:
        entry = store.get_sweep(sweep_id) if re.fullmatch(ID_PATTERN, sweep_id) else None
        if entry is None:
            raise HTTPException(404, f"no sweep {sweep_id!r}")
        table = None
        csv = store.sweep_dir(entry.id) / "sweep.csv"
        if entry.status == "finished" and csv.exists():
            frame = pd.read_csv(csv)
            table = [
                {k: json_safe(v) for k, v in row.items()}
                for row in json.loads(frame.to_json(orient="records"))
            ]
        req = entry.request
        return SweepView(
            id=entry.id,
            url=str(request.url_for("get_sweep", sweep_id=entry.id)),
            status=entry.status,
            created_at=datetime.fromtimestamp(entry.created_at, timezone.utc),
            finished_at=when(entry.finished_at),
            runs=req["runs"],
            set=req["set"],
            metric=req["metric"],
            target_accuracy=req.get("target_accuracy"),
            error=entry.error,
            table=table,
        )

    @api.post(
        "/sweeps",
        status_code=202,
        response_model=SweepView,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": SweepRequest.model_json_schema()}},
            }
        },
        responses={
            422: {"model": Problems},
            429: {"model": Message, "description": "too many sweeps wait"},
            503: {"model": Message, "description": "the server is busy: retry"},
        },
    )
    async def submit_sweep(request: Request) -> JSONResponse:
        """Queue a what-if sweep (replay without training) over finished runs. The body
        is a `SweepRequest`; its grid may have at most the service's
        ``--max-sweep-points`` points."""
        raw = await request.body()

        def work() -> SweepView:
            body = parse_model(raw, SweepRequest)
            # a grid's values are checked as a submission's are: a plugin name that is an
            # import string (channel.name=pkg.mod:X) is refused before it is imported
            with plugin_registry.imports(config.allow_imports, config.flower_apps):
                check_sweep(
                    store,
                    body.runs,
                    body.set,
                    body.metric,
                    body.target_accuracy,
                    config.data_root,
                    config.limits,
                )
            sweep_id = new_sweep_id()
            store.add_sweep(sweep_id, body.model_dump(), config.max_queued)
            sweeps.wake()
            return sweep_view(sweep_id, request)

        view = await pool.run(work)
        return JSONResponse(
            json.loads(view.model_dump_json()), status_code=202, headers={"Location": view.url}
        )

    @api.delete(
        "/sweeps/{sweep_id}",
        response_model=SweepView,
        responses={
            404: {"model": Message},
            409: {"model": Message, "description": "the sweep has ended"},
            202: {"model": SweepView, "description": "a running sweep: it stops at its next point"},
        },
    )
    def cancel_sweep(sweep_id: str, request: Request) -> JSONResponse:
        """Cancel a sweep: a waiting one leaves the queue, a running one stops at its next
        point."""
        outcome = store.cancel_sweep(sweep_id) if re.fullmatch(ID_PATTERN, sweep_id) else None
        if outcome is None:
            raise HTTPException(404, f"no sweep {sweep_id!r}")
        view = sweep_view(sweep_id, request)
        if outcome == "ended":
            raise HTTPException(409, f"sweep {sweep_id} is {view.status}")
        return JSONResponse(
            json.loads(view.model_dump_json()), status_code=202 if outcome == "stopping" else 200
        )

    @api.get("/sweeps/{sweep_id}", response_model=SweepView, responses={404: {"model": Message}})
    def get_sweep(sweep_id: str, request: Request) -> SweepView:
        """A sweep's status and, once finished, its table (one row per run and point)."""
        return sweep_view(sweep_id, request)

    @api.get(
        "/sweeps/{sweep_id}/plot.png",
        responses={200: {"content": {"image/png": {}}}, 404: {"model": Message}},
    )
    def sweep_plot(sweep_id: str) -> FileResponse:
        """The sweep's plot: its metric against the first grid path."""
        entry = store.get_sweep(sweep_id) if re.fullmatch(ID_PATTERN, sweep_id) else None
        path = store.sweep_dir(sweep_id) / "sweep.png" if entry else None
        if path is None or not path.is_file():
            raise HTTPException(404, f"no plot for sweep {sweep_id!r}")
        return FileResponse(path, media_type="image/png")

    return api
