"""How a ``mecsim serve`` is set up (``mecsim serve``'s flags)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mecsim.run.limits import SERVICE, Limits

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
    #: threads working on requests' CPU-bound parts, and requests that may wait for one
    work_threads: int = 2
    max_waiting_requests: int = 16
    #: what one submitted run or sweep may cost (``--max-rounds`` ...; docs/service.md)
    limits: Limits = SERVICE
    #: False: the API without workers (nothing queued ever runs): tests of the HTTP layer
    start_workers: bool = True
    #: whether submitted scenarios may name import strings (``pkg.module:Attr``): False,
    #: the service runs installed plugins only (``mecsim serve --allow-imports``)
    allow_imports: bool = False
    #: Flower apps submitted scenarios may name besides the installed ones: folders
    #: (their pyproject.toml's components) or ``module:attribute`` components
    #: (``mecsim serve --flower-app``)
    flower_apps: tuple[str, ...] = field(default=())
