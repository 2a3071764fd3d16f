"""Trace-driven links (rates from a CSV) and the wired backhaul link.

Trace CSV, header ``time_s,client_id,uplink_mbps,downlink_mbps`` (extra columns are
ignored; lines whose first cell starts with ``#`` are comments). Each row sets a client's
rates from ``time_s`` on (piecewise constant). ``client_id = *`` rows apply to every client
that has no rows of its own. Each schedule must start at ``time_s = 0`` and have strictly
increasing times; rates are ≥ 0 (0 = link down).

Errors name the file, the line and the column, never the text found there: the path may
point at any file (``channel.path: /etc/passwd`` must not print its first line).
"""

from __future__ import annotations

import bisect
import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike

from .wireless import ClientRadio, RoundChannel

Schedule = tuple[tuple[float, ...], tuple[float, ...]]  # (times_s, rates_bps)
_COLUMNS = ("time_s", "client_id", "uplink_mbps", "downlink_mbps")
ALL_CLIENTS = "*"


class TraceChannel:
    """Per-client uplink/downlink rates read from a CSV trace (see module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        # key: client id (int) or "*"; value: list of (time_s, uplink_bps, downlink_bps)
        self._rows: dict[int | str, list[tuple[float, float, float]]] = {}
        self._parse()

    def __repr__(self) -> str:
        ids = sorted(k for k in self._rows if k != ALL_CLIENTS)
        return (
            f"TraceChannel(path={str(self.path)!r}, clients={ids}, "
            f"default={'*' if ALL_CLIENTS in self._rows else None})"
        )

    def _error(self, line: int, column: str | None, msg: str) -> ValueError:
        where = f"{self.path}, line {line}" + (f", column {column!r}" if column else "")
        return ValueError(f"{where}: {msg}")

    def _parse(self) -> None:
        with self.path.open(newline="") as f:
            reader = csv.reader(f)
            header: list[str] | None = None
            for cells in reader:
                line = reader.line_num
                if not cells or not "".join(cells).strip() or cells[0].lstrip().startswith("#"):
                    continue
                cells = [c.strip() for c in cells]
                if header is None:
                    header = cells
                    for col in _COLUMNS:
                        if col not in header:
                            raise self._error(
                                line,
                                col,
                                "missing column (the header must name " + ", ".join(_COLUMNS) + ")",
                            )
                    idx = {col: header.index(col) for col in _COLUMNS}
                    continue
                if len(cells) < len(header):
                    raise self._error(line, None, f"{len(cells)} cells, header has {len(header)}")
                row = {col: cells[idx[col]] for col in _COLUMNS}
                self._add_row(line, row)
        if header is None:
            raise ValueError(f"{self.path}: empty trace (no header)")
        if not self._rows:
            raise ValueError(f"{self.path}: trace has a header but no rows")

    def _add_row(self, line: int, row: dict[str, str]) -> None:
        cid_s = row["client_id"]
        if cid_s == ALL_CLIENTS:
            key: int | str = ALL_CLIENTS
        else:
            try:
                key = int(cid_s)
            except ValueError:
                raise self._error(line, "client_id", "not an integer or '*'") from None
            if key < 0:
                raise self._error(line, "client_id", f"negative client id {key}")
        vals = {}
        for col in ("time_s", "uplink_mbps", "downlink_mbps"):
            try:
                v = float(row[col])
            except ValueError:
                raise self._error(line, col, "not a number") from None
            if not math.isfinite(v) or v < 0:
                what = "rate" if col != "time_s" else "time"
                raise self._error(line, col, f"the {what} must be finite and >= 0")
            vals[col] = v
        rows = self._rows.setdefault(key, [])
        t = vals["time_s"]
        if not rows and t != 0.0:
            raise self._error(
                line,
                "time_s",
                "the first row of this client starts at a time_s other than 0, not 0",
            )
        if rows and t <= rows[-1][0]:
            raise self._error(
                line,
                "time_s",
                "time_s is not after the previous row of this client: rows must be sorted",
            )
        rows.append((t, vals["uplink_mbps"] * 1e6, vals["downlink_mbps"] * 1e6))

    def _rows_for(self, client_id: int) -> list[tuple[float, float, float]]:
        rows = self._rows.get(int(client_id), self._rows.get(ALL_CLIENTS))
        if rows is None:
            raise ValueError(f"{self.path}: no rows for client {client_id} and no '*' rows")
        return rows

    def schedules(self, client_id: int) -> tuple[Schedule, Schedule]:
        """``((times_s, uplink_bps), (times_s, downlink_bps))``; times start at 0."""
        rows = self._rows_for(client_id)
        times = tuple(r[0] for r in rows)
        return (times, tuple(r[1] for r in rows)), (times, tuple(r[2] for r in rows))

    def rates_at(self, client_id: int, time_s: float) -> tuple[float, float]:
        """``(uplink_bps, downlink_bps)`` in force at ``time_s`` (≥ 0)."""
        rows = self._rows_for(client_id)
        i = bisect.bisect_right([r[0] for r in rows], time_s) - 1
        _, ul, dl = rows[max(i, 0)]
        return ul, dl

    def draw_clients(self, n_clients: int, rng: np.random.Generator) -> ClientRadio:
        """No draws; checks that every client 0..n-1 has a schedule."""
        for cid in range(n_clients):
            self._rows_for(cid)
        return ClientRadio.unmodelled(n_clients)

    def draw_round(
        self,
        radio: ClientRadio,
        client_ids: ArrayLike,
        rng: np.random.Generator,
        *,
        time_s: float = 0.0,
    ) -> RoundChannel:
        """Rates in force at the round's start ``time_s`` (the engine may use the full
        :meth:`schedules` for transfers that straddle a change)."""
        ids = np.atleast_1d(np.asarray(client_ids, dtype=np.int64))
        rates = np.array([self.rates_at(int(c), time_s) for c in ids]).reshape(-1, 2)
        return RoundChannel.constant_rates(radio, ids, rates[:, 0], rates[:, 1])


@dataclass(frozen=True)
class BackhaulLink:
    """Wired edge ↔ central link: ``t = latency_s + 8·nbytes / bandwidth_bps``."""

    bandwidth_bps: float
    latency_s: float

    def __post_init__(self) -> None:
        if not self.bandwidth_bps > 0 or not self.latency_s >= 0:
            raise ValueError("BackhaulLink needs bandwidth_bps > 0 and latency_s >= 0")

    def transfer_time_s(self, nbytes: ArrayLike) -> np.ndarray | float:
        t = self.latency_s + 8.0 * np.asarray(nbytes, dtype=float) / self.bandwidth_bps
        return float(t) if np.ndim(t) == 0 else t
