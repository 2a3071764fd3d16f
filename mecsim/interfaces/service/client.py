"""``mecsim.Client``: the service's API from Python (httpx).

    >>> import mecsim
    >>> c = mecsim.Client("http://127.0.0.1:8470")          # token: MECSIM_TOKEN
    >>> run_id = c.submit("scenarios/fedavg-mnist-10.yaml", rounds=5)
    >>> c.wait(run_id)["status"]
    'finished'
    >>> c.rounds(run_id)                                    # a pandas DataFrame
    >>> c.sweep([run_id], ["channel.uplink.bandwidth_hz=5e6,20e6"])

The URL defaults to ``MECSIM_SERVER`` (else ``http://127.0.0.1:8470``), the token to
``MECSIM_TOKEN``. Errors are :class:`ServiceError` (with the HTTP status); a scenario the
service refuses is :class:`ScenarioRejected`, whose ``problems`` name each field.
"""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import httpx

DEFAULT_URL = "http://127.0.0.1:8470"


class ServiceError(Exception):
    """The service answered with an error (``status``), or could not be reached (0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ScenarioRejected(ServiceError):
    """422: ``problems`` is a list of ``{"field": ..., "msg": ...}``, one per problem."""

    def __init__(self, problems: list[dict[str, str]]) -> None:
        super().__init__(422, "\n".join(f"{p['field']}: {p['msg']}" for p in problems))
        self.problems = problems


class Client:
    """A connection to a ``mecsim serve``."""

    def __init__(
        self, url: str | None = None, token: str | None = None, timeout_s: float = 30.0
    ) -> None:
        self.url = (url or os.environ.get("MECSIM_SERVER") or DEFAULT_URL).rstrip("/")
        token = token if token is not None else os.environ.get("MECSIM_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ plumbing

    def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            resp = self._http.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise ServiceError(
                0, f"cannot reach the mecsim service at {self.url} ({type(exc).__name__}: {exc})"
            ) from None
        if resp.status_code >= 400:
            try:
                detail = resp.json().get("detail")
            except (ValueError, AttributeError):
                detail = resp.text
            if (
                resp.status_code == 422
                and isinstance(detail, list)
                and all(isinstance(p, dict) and "field" in p for p in detail)
            ):
                raise ScenarioRejected(detail)
            if isinstance(detail, list):  # FastAPI's own request validation
                detail = "; ".join(
                    f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}"
                    for d in detail
                    if isinstance(d, dict)
                )
            raise ServiceError(
                resp.status_code, f"{method} {path}: HTTP {resp.status_code}: {detail}"
            )
        return resp

    # ------------------------------------------------------------------ runs

    def submit(
        self,
        scenario: str | Path | Mapping[str, Any] | None = None,
        *,
        rounds: int | None = None,
        set: Mapping[str, Any] | None = None,
    ) -> str:
        """Queue a run; returns its id. ``scenario``: a file path, YAML/JSON text, a
        mapping, a :class:`~mecsim.scenario.Scenario`, or None (the default scenario)."""
        if hasattr(scenario, "model_dump"):
            scenario = scenario.model_dump(mode="json")  # type: ignore[union-attr]
        elif isinstance(scenario, Path) or (
            isinstance(scenario, str)
            and "\n" not in scenario
            and scenario.endswith((".yaml", ".yml", ".json"))
        ):
            scenario = Path(scenario).read_text()
        body = {"scenario": scenario, "rounds": rounds, "set": dict(set or {})}
        return self._request("POST", "/runs", json=body).json()["id"]

    def get(self, run_id: str) -> dict[str, Any]:
        """The run's status, progress, last round and ETA."""
        return self._request("GET", f"/runs/{run_id}").json()

    def runs(
        self, status: str | Sequence[str] | None = None, limit: int = 100, offset: int = 0
    ) -> list[dict[str, Any]]:
        """Runs, newest first (``status``: one or several statuses)."""
        statuses = [status] if isinstance(status, str) else list(status or [])
        params: list[tuple[str, Any]] = [("status", s) for s in statuses]
        params += [("limit", limit), ("offset", offset)]
        return self._request("GET", "/runs", params=params).json()["runs"]

    def wait(
        self, run_id: str, timeout_s: float | None = None, poll_s: float = 0.5
    ) -> dict[str, Any]:
        """Poll until the run has ended (finished, failed or cancelled); its status."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            run = self.get(run_id)
            if run["status"] in ("finished", "failed", "cancelled"):
                return run
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} is still {run['status']} after {timeout_s:g} s")
            time.sleep(poll_s)

    def cancel(self, run_id: str) -> dict[str, Any]:
        """Cancel: a queued run leaves the queue, a running one stops after its round."""
        return self._request("DELETE", f"/runs/{run_id}").json()

    def events(self, run_id: str) -> Iterator[tuple[str, dict[str, Any]]]:
        """The run's server-sent events: ``("round", row)`` per round, then ``("end",
        {...})``."""
        try:
            with self._http.stream(
                "GET", f"/runs/{run_id}/events", timeout=httpx.Timeout(30.0, read=None)
            ) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    raise ServiceError(
                        resp.status_code,
                        f"events of {run_id}: HTTP {resp.status_code}: {resp.text}",
                    )
                event, data = "message", cast(list[str], [])
                for line in resp.iter_lines():
                    if line == "":
                        if data:
                            yield event, json.loads("\n".join(data))
                            if event == "end":
                                return
                        event, data = "message", []
                    elif line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:"):
                        data.append(line[5:].strip())
        except httpx.TransportError as exc:
            raise ServiceError(0, f"events of {run_id}: {type(exc).__name__}: {exc}") from None

    def _table(self, run_id: str, name: str):
        import pandas as pd

        resp = self._request("GET", f"/runs/{run_id}/{name}", params={"format": "parquet"})
        return pd.read_parquet(io.BytesIO(resp.content))

    def rounds(self, run_id: str):
        """rounds.csv of the run as a pandas DataFrame (its finished rounds so far)."""
        return self._table(run_id, "rounds")

    def clients(self, run_id: str):
        """clients.csv of the run as a pandas DataFrame."""
        return self._table(run_id, "clients")

    def summary(self, run_id: str) -> str:
        return self._request("GET", f"/runs/{run_id}/summary").text

    def scenario(self, run_id: str) -> str:
        """The resolved scenario (YAML) the run executes."""
        return self._request("GET", f"/runs/{run_id}/scenario").text

    def fetch(self, run_id: str, out_dir: str | Path) -> Path:
        """Download the run's folder into ``out_dir`` (created; must be new or empty): a
        run folder that ``mecsim report`` and ``mecsim sweep`` accept."""
        out = Path(out_dir)
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise FileExistsError(f"{out} exists and is not an empty folder")
        files = self._request("GET", f"/runs/{run_id}/files").json()
        if not files:
            raise ServiceError(409, f"run {run_id} has no records yet")
        out.mkdir(parents=True, exist_ok=True)
        root = out.resolve()
        for f in files:
            target = (root / f["name"]).resolve()
            if not target.is_relative_to(root):
                raise ServiceError(502, f"the service named a file outside the run: {f['name']!r}")
            target.parent.mkdir(parents=True, exist_ok=True)
            data = self._request("GET", f"/runs/{run_id}/files/{f['name']}").content
            target.write_bytes(data)
        return out

    # ------------------------------------------------------------------ sweeps

    def sweep(
        self,
        runs: Sequence[str],
        grid: Sequence[str] | Mapping[str, Sequence[Any]],
        *,
        metric: str = "round_time_mean_s",
        target_accuracy: float | None = None,
        timeout_s: float | None = 600.0,
    ):
        """A what-if sweep over finished runs; its table as a DataFrame.

        ``grid``: ``mecsim sweep --set`` strings (``"PATH=V1,V2"``) or a mapping of path to
        values."""
        import pandas as pd

        if isinstance(grid, Mapping):

            def text(v: Any) -> str:
                return json.dumps(v) if isinstance(v, (list, dict)) else str(v)

            sets = [f"{p}={','.join(text(v) for v in vs)}" for p, vs in grid.items()]
        else:
            sets = list(grid)
        body = {
            "runs": list(runs),
            "set": sets,
            "metric": metric,
            "target_accuracy": target_accuracy,
        }
        view = self._request("POST", "/sweeps", json=body).json()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while view["status"] not in ("finished", "failed"):
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"sweep {view['id']} is still {view['status']}")
            time.sleep(0.3)
            view = self._request("GET", f"/sweeps/{view['id']}").json()
        if view["status"] == "failed":
            raise ServiceError(500, f"sweep {view['id']} failed: {view['error']}")
        frame = pd.DataFrame(view["table"])
        frame.attrs["sweep_id"] = view["id"]
        return frame

    # ------------------------------------------------------------------ service

    def health(self) -> bool:
        try:
            return self._http.get("/healthz").status_code == 200
        except httpx.TransportError:
            return False

    def ready(self) -> bool:
        try:
            return self._http.get("/readyz").status_code == 200
        except httpx.TransportError:
            return False
