"""What the service's endpoints need from the application, as FastAPI dependencies.

:func:`~mecsim.interfaces.service.app.create_app` keeps the store, the configuration, the
worker, the sweep runner, the request work pool and the run feeds on ``app.state``; an
endpoint names the one it needs by its annotated type (``store: StoreDep``), as FastAPI's
documentation does with ``Annotated[..., Depends(...)]``. :data:`RunDep` is the run named
by the path's ``run_id`` (404 if there is none).
"""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import Depends, HTTPException, Request

from mecsim.interfaces.service.bounded import WorkPool
from mecsim.interfaces.service.config import ServiceConfig
from mecsim.interfaces.service.events import Feeds
from mecsim.interfaces.service.jobs import Run, Store
from mecsim.interfaces.service.schemas import ID_PATTERN
from mecsim.interfaces.service.sweep_runner import SweepRunner
from mecsim.interfaces.service.worker import Worker


def _store(request: Request) -> Store:
    return request.app.state.store


def _config(request: Request) -> ServiceConfig:
    return request.app.state.config


def _worker(request: Request) -> Worker:
    return request.app.state.worker


def _sweeps(request: Request) -> SweepRunner:
    return request.app.state.sweeps


def _pool(request: Request) -> WorkPool:
    return request.app.state.pool


def _feeds(request: Request) -> Feeds:
    return request.app.state.feeds


StoreDep = Annotated[Store, Depends(_store)]
ConfigDep = Annotated[ServiceConfig, Depends(_config)]
WorkerDep = Annotated[Worker, Depends(_worker)]
SweepsDep = Annotated[SweepRunner, Depends(_sweeps)]
PoolDep = Annotated[WorkPool, Depends(_pool)]
FeedsDep = Annotated[Feeds, Depends(_feeds)]


def get_run_or_404(store: Store, run_id: str) -> Run:
    """The run ``run_id`` of ``store``; HTTP 404 if there is none (or the id is malformed)."""
    run = store.get_run(run_id) if re.fullmatch(ID_PATTERN, run_id) else None
    if run is None:
        raise HTTPException(404, f"no run {run_id!r}")
    return run


def _run(run_id: str, store: StoreDep) -> Run:
    return get_run_or_404(store, run_id)


RunDep = Annotated[Run, Depends(_run)]
