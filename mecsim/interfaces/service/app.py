"""The HTTP API of ``mecsim serve`` (FastAPI): runs, records, sweeps, metrics, health.

:func:`create_app` assembles the application around a
:class:`~mecsim.interfaces.service.jobs.Store`: the guards
(:mod:`~mecsim.interfaces.service.security`), the routers of runs
(:mod:`~mecsim.interfaces.service.api_runs`), sweeps
(:mod:`~mecsim.interfaces.service.api_sweeps`) and the web page
(:mod:`~mecsim.interfaces.service.web`), and the service's own endpoints (health,
readiness, ``/metrics``, the OpenAPI description). Its lifespan recovers runs a dead
server left ``running``, starts the :class:`~mecsim.interfaces.service.worker.Worker`
(one Ray for the server's life) and the sweep thread, and stops them on shutdown. The
endpoints are listed in ``docs/service.md``; ``/openapi.json`` and ``/docs`` describe
them too.

Security, in the order a request meets it:

- with a token, every endpoint but ``/healthz`` and ``/metrics`` needs
  ``Authorization: Bearer <token>`` (compared in constant time), else 401, before any of
  the body is read;
- request bodies above ``max_body_bytes`` get 413 (by ``Content-Length`` or while read);
- a server on loopback accepts only loopback ``Host`` names (no DNS rebinding), and a
  ``POST``/``DELETE`` whose ``Origin`` is another site gets 403 (no cross-site forms);
- every answer says it may not be framed and its type not sniffed;
- a body is parsed within bounds (:mod:`~mecsim.interfaces.service.bounded`: size,
  depth, numbers, strings) and the work of a request (validation, the pre-flight, sweep
  planning) runs in a bounded pool off the event loop (503 when its queue is full); a
  run above the service's limits (``--max-rounds`` ...) gets 422;
- submitted scenarios are validated as ``mecsim validate`` does and confined to the data
  root (:mod:`mecsim.interfaces.service.submission`); the number of waiting runs is
  bounded (429 beyond it); run ids are made by the server and only ``[a-z0-9-]`` ids are
  looked up.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

import mecsim.registry as plugin_registry
from mecsim import __version__
from mecsim.interfaces.service import api_runs
from mecsim.interfaces.service.api_runs import queue_run
from mecsim.interfaces.service.api_sweeps import sweeps_router
from mecsim.interfaces.service.bounded import BadBody, Busy, WorkPool
from mecsim.interfaces.service.config import ServiceConfig
from mecsim.interfaces.service.events import Feeds
from mecsim.interfaces.service.jobs import QueueFull, Run, Store
from mecsim.interfaces.service.monitoring import RunSeries, service_registry
from mecsim.interfaces.service.schemas import Message
from mecsim.interfaces.service.security import (
    BodyLimit,
    PageHeaders,
    SameSite,
    TokenGuard,
    bearer_auth,
    is_loopback,
)
from mecsim.interfaces.service.submission import Rejected
from mecsim.interfaces.service.sweep_runner import SweepRunner
from mecsim.interfaces.service.web import web_router
from mecsim.interfaces.service.worker import Worker

__all__ = ["ServiceConfig", "create_app"]


def create_app(config: ServiceConfig, store: Store | None = None) -> FastAPI:
    """The service application; ``store`` defaults to one opened on ``config.state_dir``."""
    store = store or Store(config.state_dir)
    series = RunSeries(config.metrics_retention_s)
    worker = Worker(
        store,
        workers=config.workers,
        ray_address=config.ray_address,
        exporter=series.exporter,
        on_finished=series.finished,
        shutdown_timeout_s=config.shutdown_timeout_s,
    )
    sweeps = SweepRunner(store)
    registry = service_registry(
        store, config.workers, lambda: len(worker.busy), lambda: worker.ready, lambda: len(series)
    )

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
            pool.close()

    app = FastAPI(
        title="mecsim service",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        description="Queued mecsim runs, their records, what-if sweeps and one "
        "Prometheus target. See docs/service.md.",
    )
    app.state.store = store
    app.state.worker = worker
    app.state.config = config
    app.state.series = series
    app.state.sweeps = sweeps
    app.state.feeds = Feeds(store)  # the runs' event feeds, made on a first follower
    # the last added is the outermost: headers on every answer, then the token (before
    # anything of the body is read), the body's size, the Host and Origin
    app.add_middleware(SameSite, check_host=is_loopback(config.host))
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)
    app.add_middleware(TokenGuard, token=config.token)
    app.add_middleware(PageHeaders)
    authorised = bearer_auth(config.token)
    pool = WorkPool(config.work_threads, config.max_waiting_requests)
    app.state.pool = pool

    def problems(items: list[tuple[str, str]]) -> JSONResponse:
        return JSONResponse({"detail": [{"field": f, "msg": m} for f, m in items]}, status_code=422)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        # pydantic's errors without the input (which may not even be encodable): each
        # entry both FastAPI's shape (loc, msg, type) and the service's (field, msg)
        out = []
        for err in exc.errors():
            loc = [p if isinstance(p, int) else str(p)[:100] for p in err.get("loc", ())]
            out.append(
                {
                    "loc": loc,
                    "field": ".".join(str(p) for p in loc) or "(request)",
                    "msg": str(err.get("msg", "invalid")).splitlines()[0][:300],
                    "type": str(err.get("type", "invalid")),
                }
            )
        return JSONResponse({"detail": out}, status_code=422)

    @app.exception_handler(BadBody)
    async def bad_body(request: Request, exc: BadBody) -> JSONResponse:
        return problems(exc.problems)

    @app.exception_handler(Rejected)
    async def rejected(request: Request, exc: Rejected) -> JSONResponse:
        return problems([(p.field, p.msg) for p in exc.problems])

    @app.exception_handler(QueueFull)
    async def queue_full(request: Request, exc: QueueFull) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=429, headers={"Retry-After": "30"})

    @app.exception_handler(Busy)
    async def busy(request: Request, exc: Busy) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=503, headers={"Retry-After": "2"})

    service = APIRouter(
        dependencies=[Depends(authorised)],
        responses={
            401: {
                "model": Message,
                "description": "missing or wrong token (servers started with --token-file)",
            }
        },
    )

    @service.get("/readyz", responses={503: {"model": Message}})
    def readyz() -> JSONResponse:
        """200 once the service's Ray is up and workers take runs; 503 before (or if Ray
        failed to start: the reason)."""
        if worker.ready:
            return JSONResponse(
                {"ready": True, "workers": config.workers, "busy": len(worker.busy)}
            )
        reason = worker.ray_error or (
            "not taking runs (started without workers)"
            if not config.start_workers
            else "starting Ray"
        )
        return JSONResponse({"ready": False, "detail": reason}, status_code=503)

    @service.get("/plugins")
    def plugins() -> dict[str, Any]:
        """What submitted scenarios may name: every installed algorithm, model, dataset,
        channel and device entry (name, kind, distribution, version, whether it loads),
        and whether this server accepts import strings (``--allow-imports``)."""
        with plugin_registry.imports(config.allow_imports, config.flower_apps):
            flower = plugin_registry.flower_components()
        return {
            "allow_imports": config.allow_imports,
            "plugins": plugin_registry.listing(),
            "flower_apps": [{"component": k, "declared_by": v} for k, v in sorted(flower.items())],
        }

    @service.get("/openapi.json", include_in_schema=False)
    def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @service.get("/docs", include_in_schema=False)
    def docs() -> Any:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="mecsim service")

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> Response:
        return Response(status_code=204)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """200 while the server answers (no token needed)."""
        return {"status": "ok"}

    @app.get("/metrics", responses={200: {"content": {"text/plain": {}}}})
    def metrics() -> Response:
        """Prometheus: every retained run's series and the service's (no token needed)."""
        page = series.render() + generate_latest(registry).decode()
        return Response(page, media_type=CONTENT_TYPE_LATEST)

    def submit_form(text: str, rounds: int | None, overrides: dict[str, Any]) -> Run:
        """The web form's submission: the same checks as ``POST /runs``."""
        return queue_run(store, config, worker, text, rounds, overrides)

    app.include_router(api_runs.router, dependencies=[Depends(authorised)])
    app.include_router(sweeps_router(store, config, sweeps, authorised, pool))
    app.include_router(service)
    app.include_router(
        web_router(store, config, authorised, submit_form=submit_form, pool=pool),
        include_in_schema=False,
    )
    return app
