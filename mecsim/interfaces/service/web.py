"""The service's web page: server-rendered (Jinja2), no JavaScript.

- ``GET /``: the runs table (status, progress, algorithm, rounds, best accuracy,
  emulated time);
- ``GET /ui/submit``: a form to submit a scenario file (rounds and overrides optional);
- ``GET /ui/runs/{id}``: a run's status, summary tables, figures and downloads;
- ``POST /ui/runs`` (the form) and ``POST /ui/runs/{id}/cancel``: answered with a
  redirect to the run's page, or the page again with the problems listed.

Pages showing a run that has not ended reload themselves every few seconds (a
``<meta http-equiv="refresh">``). The same token rules as the API apply.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, File, Form, HTTPException, Request, UploadFile
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.templating import Jinja2Templates

from mecsim.interfaces.service.bounded import Busy, WorkPool
from mecsim.interfaces.service.jobs import TERMINAL, QueueFull, Run, Store
from mecsim.interfaces.service.submission import Problem, Rejected
from mecsim.interfaces.service.views import plot_names, read_records
from mecsim.scenario.overrides import OverrideError, parse_assignment
from mecsim.store.summary import summarise, table_rows, table_titles

TEMPLATES = Path(__file__).with_name("templates")
REFRESH_S = 3


def _fmt_time(ts: float | None) -> str:
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _row(run: Run) -> dict[str, Any]:
    return {
        "run": run,
        "submitted": _fmt_time(run.submitted_at),
        "percent": int(100 * run.rounds_done / max(1, run.rounds_planned)),
    }


def _summary_tables(store: Store, run: Run) -> list[dict[str, Any]]:
    frame = read_records(store, run, "rounds")
    if frame is None or frame.empty:
        return []
    s = summarise(frame.to_dict("records"))
    th, tc, ch, cc = table_rows(s)
    time_title, cost_title = table_titles(s)
    return [
        {"title": time_title, "header": th, "cells": tc},
        {"title": cost_title, "header": ch, "cells": cc},
    ]


def parse_set_lines(text: str) -> dict[str, Any]:
    """``PATH=VALUE`` lines (one value each, ``mecsim submit --set`` syntax)."""
    out: dict[str, Any] = {}
    problems = []
    for line in (x.strip() for x in text.splitlines()):
        if not line:
            continue
        try:
            path, value = parse_assignment(line)  # one value: no lists made
        except OverrideError as exc:
            problems.append(Problem("set", str(exc)))
            continue
        out[path] = value
    if problems:
        raise Rejected(problems)
    return out


def web_router(
    store: Store,
    config: Any,
    authorised: Callable,
    submit_form: Callable[[str, int | None, dict[str, Any]], Run],
    pool: WorkPool,
) -> APIRouter:
    templates = Jinja2Templates(directory=str(TEMPLATES))
    router = APIRouter(dependencies=[Depends(authorised)])

    def page(request: Request, name: str, status_code: int = 200, **context: Any):
        return templates.TemplateResponse(request, name, context, status_code=status_code)

    @router.get("/", response_class=HTMLResponse)
    def index(request: Request):
        runs, total = store.list_runs(limit=200)
        active = any(r.status not in TERMINAL for r in runs)
        return page(
            request,
            "index.html",
            rows=[_row(r) for r in runs],
            total=total,
            refresh=REFRESH_S if active else None,
            counts=store.counts(),
        )

    def submit_page(
        request: Request,
        problems: list[Problem] | None = None,
        status_code: int = 200,
        message: str | None = None,
    ):
        return page(request, "submit.html", status_code, problems=problems or [], message=message)

    @router.get("/ui/submit", response_class=HTMLResponse)
    def submit_form_page(request: Request):
        return submit_page(request)

    @router.post("/ui/runs", response_class=HTMLResponse)
    async def submit(
        request: Request,
        scenario: Annotated[UploadFile, File()],
        rounds: Annotated[str, Form()] = "",
        overrides: Annotated[str, Form()] = "",
    ):
        raw = await scenario.read()  # the body limit bounds it

        def work() -> Run:  # in the work pool, off the event loop
            text = raw.decode("utf-8", errors="replace").replace("\x00", "\ufffd")
            n = None
            if rounds.strip():
                if not re.fullmatch(r"\d{1,7}", rounds.strip()) or int(rounds) < 1:
                    raise Rejected(
                        [Problem("rounds", f"{rounds[:40]!r} is not a whole number >= 1")]
                    )
                n = int(rounds)
            return submit_form(text, n, parse_set_lines(overrides))

        try:
            run = await pool.run(work)
        except Rejected as exc:
            return submit_page(request, exc.problems, 422)
        except QueueFull as exc:
            return submit_page(request, None, 429, message=str(exc))
        except Busy as exc:
            return submit_page(request, None, 503, message=str(exc))
        return RedirectResponse(f"/ui/runs/{run.id}", status_code=303)

    def get_run(run_id: str) -> Run:
        run = store.get_run(run_id) if re.fullmatch(r"[a-z0-9][a-z0-9-]{0,99}", run_id) else None
        if run is None:
            raise HTTPException(404, f"no run {run_id!r}")
        return run

    @router.get("/ui/runs/{run_id}", response_class=HTMLResponse)
    def run_page(run_id: str, request: Request):
        run = get_run(run_id)
        return page(
            request,
            "run.html",
            run=run,
            percent=int(100 * run.rounds_done / max(1, run.rounds_planned)),
            tables=_summary_tables(store, run),
            plots=plot_names(store, run.id),
            history=[{**h, "at": _fmt_time(h["at"])} for h in run.history],
            times={
                "submitted": _fmt_time(run.submitted_at),
                "started": _fmt_time(run.started_at),
                "finished": _fmt_time(run.finished_at),
            },
            ended=run.status in TERMINAL,
            refresh=None if run.status in TERMINAL else REFRESH_S,
        )

    @router.post("/ui/runs/{run_id}/cancel")
    def cancel(run_id: str):
        run = get_run(run_id)
        store.request_cancel(run.id)
        return RedirectResponse(f"/ui/runs/{run.id}", status_code=303)

    return router
