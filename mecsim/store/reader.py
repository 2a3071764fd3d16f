"""Reading a run folder back: the one reader, strict, and exact.

Everything that reads a run folder written by ``mecsim run`` — a replay and a sweep over
it (:func:`mecsim.analysis.replay.load_run`), the reports (``mecsim report``,
:func:`mecsim.load_run`), a resume (:func:`mecsim.store.runfolder.prepare_resume`) —
reads it through this module, so that a folder that was tampered with, cut, or written
by another version is either refused with one line naming the file and the line
(:class:`RecordError`) or read as it was written. Never half-read: nothing is changed
before every file has been read and checked.

What is checked:

- ``run.json``: a JSON object; the fields the readers use have their types and ranges;
  ``records_format`` (absent before it existed: format 1) is one this version reads;
  ``scenario_sha256`` (absent in older folders), when present, is the sha256 of
  ``scenario.yaml``: a changed scenario is refused, not replayed as if it had run;
- ``rounds.csv`` / ``clients.csv``: UTF-8 text, the columns the reader needs, every
  round index an integer, the rounds 0, 1, 2, ... in order (a duplicated, missing or
  reordered row is refused), one row per client and round, client ids within the
  scenario's ``topology.clients``, counts and bytes non-negative integers, seconds,
  FLOPs and joules non-negative and finite (empty where a column was added by a later
  version: not recorded), accuracies in [0, 1] or empty (not evaluated);
- ``optraces.jsonl``: each line one JSON object of the keys this version writes (a key
  or an op it does not know is refused: a newer version's), line *i* round *i*, every
  op's bytes and batches non-negative integers and FLOPs non-negative and finite, the
  selected clients those of the traces and within ``topology.clients``.

A last line without its newline (a run killed while writing it) is not a row: it is
left out, as the round it belongs to was not finished. Every other defect is refused.
Floats are read back exactly as written (``repr``).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mecsim.emulation.ops import Op, OpTrace, op_from_dict

#: the records' format this version writes (``run.json``'s ``records_format``) and the
#: newest it reads; a folder without it was written before it existed (format 1)
RECORDS_FORMAT = 1

# Floats must be read back exactly as written (repr). pandas < 3's default parser can be
# 1 ulp off, so ask for round_trip there; pandas >= 3 is exact and deprecates the option.
_EXACT_FLOATS = {"float_precision": "round_trip"} if int(pd.__version__.split(".")[0]) < 3 else {}


class RecordError(ValueError):
    """A file of a run folder that is not what mecsim writes; ``str()`` is one line,
    ``file:line: why`` (or ``file: why``)."""


def read_csv_exact(path: str | Path) -> pd.DataFrame:
    """A records CSV with every float exactly as written (no checks: a file this process
    just wrote, e.g. for its Parquet copy)."""
    return pd.read_csv(path, **_EXACT_FLOATS)


def rows_from_csv(path: Path) -> list[dict[str, Any]]:
    """Round rows of ``rounds.csv`` read back as a run produced them (numbers exact)."""
    if not path.exists() or path.stat().st_size == 0:
        return []
    rows: list[dict[str, Any]] = read_csv_exact(path).to_dict("records")
    return rows


# ------------------------------------------------------------------------------ text


def _text(path: Path, lines: bool = True) -> str:
    """The file as text; with ``lines`` (an appended file) its complete lines only, a last
    line without its newline (cut by a kill) left out. Bytes that are not UTF-8 are
    refused naming the line."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise RecordError(
            f"{path}: missing; is this a run folder written by `mecsim run`?"
        ) from None
    except OSError as exc:
        raise RecordError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if lines:
        data = data[: data.rfind(b"\n") + 1]
    try:
        text = data.decode("utf-8")
        bad = data.find(b"\x00")
    except UnicodeDecodeError as exc:
        nul = data.find(b"\x00", 0, exc.start)
        bad = exc.start if nul < 0 else nul
    if bad >= 0:  # the first byte that is not text: a NUL, or not UTF-8
        line = data[:bad].count(b"\n") + 1
        raise RecordError(f"{path}:{line}: binary data, not UTF-8 text")
    return text


def _problem(exc: ValidationError) -> str:
    """The first problem pydantic found, as ``where: what``."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    msg = str(err["msg"])
    if err["type"] == "union_tag_invalid":
        tag = (err.get("ctx") or {}).get("tag")
        msg = f"op {tag!r} is not one this mecsim knows (written by a newer version?)"
    elif err["type"] == "extra_forbidden":
        msg = "a key this mecsim does not write (written by a newer version?)"
    return f"{where}: {msg}" if where else msg


# ------------------------------------------------------------------------------ run.json


class _Resume(BaseModel):
    model_config = ConfigDict(extra="allow")
    from_round: Annotated[int, Field(strict=True, ge=0)]


class _Meta(BaseModel):
    """The fields of ``run.json`` the readers use (others are kept as written)."""

    model_config = ConfigDict(extra="allow")
    records_format: Annotated[int, Field(strict=True, ge=1)] = 1
    run_id: Annotated[str, Field(strict=True, max_length=1000)] | None = None
    status: Literal["running", "finished", "interrupted", "cancelled", "failed"] | None = None
    rounds_done: Annotated[int, Field(strict=True, ge=0)] | None = None
    rounds_planned: Annotated[int, Field(strict=True, ge=0)] | None = None
    step_memory_bytes: Annotated[int, Field(strict=True, ge=0)] | None = None
    client_devices: list[Annotated[str, Field(strict=True)]] | None = None
    aggregate_flops_per_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    resumes: list[_Resume] = []
    scenario_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None


def _key_line(text: str, key: str) -> int:
    """The line of ``"key":`` in a JSON text (1 when it is not found)."""
    at = text.find(f'"{key}"')
    return text[:at].count("\n") + 1 if at >= 0 else 1


def read_meta(run_dir: str | Path, *, strict: bool = False) -> dict[str, Any]:
    """``run.json`` as a dict. Lenient (``strict=False``: the run's status for a
    listing): {} when it is missing or unreadable. Strict: {} only when it is missing
    (a folder of a version that did not write it); anything else that is not a
    ``run.json`` mecsim writes is a :class:`RecordError`."""
    path = Path(run_dir) / "run.json"
    if not strict:
        try:
            meta = json.loads(path.read_text())
        except (OSError, ValueError, RecursionError):
            return {}
        return meta if isinstance(meta, dict) else {}
    if not path.exists():
        return {}
    text = _text(path, lines=False)
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
    except RecursionError:
        raise RecordError(f"{path}:1: nested too deeply to be a run.json") from None
    if not isinstance(meta, dict):
        raise RecordError(f"{path}:1: not a JSON object")
    try:
        _Meta.model_validate(meta)
    except ValidationError as exc:
        key = str(exc.errors()[0]["loc"][0]) if exc.errors()[0]["loc"] else ""
        raise RecordError(f"{path}:{_key_line(text, key)}: {_problem(exc)}") from None
    fmt = meta.get("records_format", 1)
    if fmt > RECORDS_FORMAT:
        raise RecordError(
            f"{path}:{_key_line(text, 'records_format')}: records format {fmt}, written by "
            f"a newer mecsim ({meta.get('mecsim_version', 'unknown version')}); this one "
            f"reads format {RECORDS_FORMAT}"
        )
    return meta


def scenario_sha256(text: str) -> str:
    """What ``run.json``'s ``scenario_sha256`` holds: the sha256 of ``scenario.yaml``."""
    return hashlib.sha256(text.encode()).hexdigest()


def check_scenario(run_dir: str | Path, meta: dict[str, Any], clients: int) -> None:
    """The folder's ``scenario.yaml`` is the one its run wrote (its sha256, when run.json
    records it), for ``clients`` clients (run.json's ``client_devices``)."""
    run_dir = Path(run_dir)
    path = run_dir / "scenario.yaml"
    recorded = meta.get("scenario_sha256")
    if recorded is not None and scenario_sha256(_text(path, lines=False)) != recorded:
        raise RecordError(
            f"{path}: changed since the run wrote it (its sha256 is not run.json's "
            "scenario_sha256); its records were not made with it"
        )
    devices = meta.get("client_devices")
    if devices is not None and len(devices) != clients:
        raise RecordError(
            f"{path}: topology.clients is {clients}, but the run recorded {len(devices)} "
            f"clients (run.json's client_devices); its records were not made with it"
        )


# ------------------------------------------------------------------------------ CSV

_COUNT = "count"  # a non-negative integer
_COUNT_OR_EMPTY = "count?"  # a non-negative integer, or empty (not recorded)
_COST = "cost"  # non-negative and finite
_COST_OR_EMPTY = "cost?"  # non-negative and finite, or empty (a column added since)
_TIME_OR_EMPTY = "time?"  # non-negative, or empty / inf (a client that never finished)
_SHARE = "share?"  # in [0, 1], or empty (not evaluated)
_FLOAT = "float"  # any number, or empty

#: rounds.csv: what each column mecsim writes must hold (columns of the algorithms and
#: channels beyond these are read as numbers or text, unchecked)
ROUND_CHECKS: dict[str, str] = {
    "round": _COUNT,
    **dict.fromkeys(
        ("selected", "completed", "dropped", "dropped_deadline", "crashed", "dropped_out"),
        _COUNT_OR_EMPTY,
    ),
    **dict.fromkeys(("outage", "rejected", "faults", "bytes_up", "bytes_down"), _COUNT_OR_EMPTY),
    **dict.fromkeys(
        (
            "round_time_s",
            "dl_time_s",
            "client_time_s",
            "ul_time_s",
            "server_time_s",
            "elapsed_s",
            "client_gflops",
            "server_gflops",
            "backhaul_time_s",
            "idle_time_s",
            "energy_j",
            "energy_compute_j",
            "energy_radio_j",
            "energy_idle_j",
            "energy_sleep_j",
            "server_rss_mb",
            "client_peak_mb",
            "host_wall_s",
            "host_train_wall_s",
            "host_aggregate_s",
        ),
        _COST_OR_EMPTY,
    ),
    **dict.fromkeys(("mean_accuracy", "min_accuracy", "max_accuracy"), _SHARE),
    **dict.fromkeys(("mean_test_loss", "train_loss"), _FLOAT),
}

#: clients.csv, as :data:`ROUND_CHECKS`
CLIENT_CHECKS: dict[str, str] = {
    "round": _COUNT,
    "client_id": _COUNT,
    # a client whose link was down never finishes its download: inf seconds
    **dict.fromkeys(
        ("start_s", "finish_s", "download_s", "compute_s", "upload_s", "server_compute_s"),
        _TIME_OR_EMPTY,
    ),
    **dict.fromkeys(
        (
            "bytes_up",
            "bytes_down",
            "gflops",
            "steps",
            "num_samples",
            "peak_memory_mb",
            "host_train_s",
            "energy_j",
            "energy_compute_j",
            "energy_radio_j",
            "energy_idle_j",
            "energy_sleep_j",
        ),
        _COST_OR_EMPTY,
    ),
    "accuracy": _SHARE,
    **dict.fromkeys(("train_loss", "test_loss"), _FLOAT),
}


#: the rounds.csv columns every version wrote and a resume appends to
ROUND_REQUIRED = (
    "round",
    "algorithm",
    *(c for c, kind in ROUND_CHECKS.items() if kind == _COUNT_OR_EMPTY),
    "round_time_s",
    "dl_time_s",
    "client_time_s",
    "ul_time_s",
    "server_time_s",
    "elapsed_s",
    "client_gflops",
    "server_gflops",
    "mean_accuracy",
)
#: the clients.csv columns a resume needs
CLIENT_REQUIRED = ("round", "client_id", "selected")


def _bad_row(path: Path, i: int, column: str, value: Any, what: str) -> RecordError:
    # row i of the frame is line i + 2 of the file (line 1 is the header)
    return RecordError(f"{path}:{i + 2}: {column} is {value!r}, {what}")


def _check_column(path: Path, frame: pd.DataFrame, column: str, kind: str) -> None:
    raw = frame[column]
    values = pd.to_numeric(raw, errors="coerce")
    if raw.dtype == bool:
        values = values.astype(float)
    text = raw.astype(str).str.strip()
    empty = raw.isna() | (text == "")
    not_a_number = values.isna() & ~empty & ~text.str.lower().isin(["nan"])
    if not_a_number.any():
        i = int(np.flatnonzero(not_a_number.to_numpy())[0])
        raise _bad_row(path, i, column, raw.iloc[i], "not a number")
    v = values.to_numpy(dtype=float)
    nan = np.isnan(v)
    if kind in (_COUNT, _COUNT_OR_EMPTY):
        fin = np.isfinite(v)
        whole = fin & (v >= 0) & (np.mod(v, 1, where=fin, out=np.ones_like(v)) == 0)
        bad = ~whole & (~nan if kind == _COUNT_OR_EMPTY else True)
        what = "not a non-negative integer"
    elif kind == _COST:
        bad = nan | ~np.isfinite(v) | (v < 0)
        what = "not a non-negative finite number"
    elif kind == _COST_OR_EMPTY:
        bad = ~nan & (~np.isfinite(v) | (v < 0))
        what = "not a non-negative finite number"
    elif kind == _TIME_OR_EMPTY:
        bad = ~nan & (v < 0)
        what = "negative"
    elif kind == _SHARE:
        bad = ~nan & ((v < 0) | (v > 1))
        what = "not a share in [0, 1]"
    else:
        return
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise _bad_row(path, i, column, raw.iloc[i], what)


def read_table(
    path: str | Path,
    checks: dict[str, str],
    required: Sequence[str] = ("round",),
) -> pd.DataFrame:
    """``rounds.csv`` or ``clients.csv`` (``checks``: :data:`ROUND_CHECKS`,
    :data:`CLIENT_CHECKS`), every float exactly as written, each column ``checks`` names
    checked where present and every ``required`` one present; :class:`RecordError`
    naming the file and the line otherwise."""
    path = Path(path)
    text = _text(path)
    if not text.strip():
        raise RecordError(f"{path}: empty (no header)")
    try:
        rows = csv.reader(io.StringIO(text, newline=""))
        width = len(next(rows))
        for n, cells in enumerate(rows, start=2):
            if len(cells) != width:  # a line cut and joined, a hand edit
                raise RecordError(f"{path}:{n}: {len(cells)} cells where the header has {width}")
    except csv.Error as exc:
        raise RecordError(f"{path}: not a CSV file of records ({exc})") from None
    try:
        frame = pd.read_csv(io.StringIO(text), **_EXACT_FLOATS)
    except pd.errors.ParserError as exc:
        raise RecordError(f"{path}: {' '.join(str(exc).split())}") from None
    except (pd.errors.EmptyDataError, ValueError) as exc:
        raise RecordError(f"{path}: not a CSV file of records ({exc})") from None
    header = [str(c) for c in frame.columns]
    dupes = sorted({c for c in header if header.count(c) > 1 or c.endswith(".1")})
    if dupes:
        raise RecordError(f"{path}:1: column {dupes[0]!r} twice in the header")
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise RecordError(f"{path}: missing columns {', '.join(missing)}")
    for column, kind in checks.items():
        if column in frame.columns:
            _check_column(path, frame, column, kind)
    if "round" in frame.columns:
        frame["round"] = frame["round"].astype(int)
    return frame


def check_rounds_in_order(path: Path, frame: pd.DataFrame) -> None:
    """The rows of ``rounds.csv`` are rounds 0, 1, 2, ... in order."""
    rounds = frame["round"].to_numpy()
    bad = np.flatnonzero(rounds != np.arange(len(rounds)))
    if bad.size:
        i = int(bad[0])
        seen = "a duplicated" if int(rounds[i]) in rounds[:i] else "a missing or reordered"
        raise RecordError(
            f"{path}:{i + 2}: round {int(rounds[i])} where round {i} was expected ({seen} row)"
        )


def check_client_rows(path: Path, frame: pd.DataFrame, clients: int | None) -> None:
    """One row per client and round, client ids below ``clients`` (when known)."""
    if "client_id" not in frame.columns:
        return
    ids = frame["client_id"].to_numpy(dtype=float)
    if clients is not None and (ids >= clients).any():
        i = int(np.flatnonzero(ids >= clients)[0])
        raise RecordError(
            f"{path}:{i + 2}: client {int(ids[i])}, but the scenario has {clients} clients "
            "(topology.clients changed?)"
        )
    dup = frame.duplicated(["round", "client_id"]).to_numpy()
    if dup.any():
        i = int(np.flatnonzero(dup)[0])
        raise RecordError(
            f"{path}:{i + 2}: client {int(ids[i])} of round {int(frame['round'].iloc[i])} "
            "again (a duplicated row)"
        )
    if "selected" in frame.columns:
        sel = frame["selected"].astype(str).str.strip().str.lower()
        bad = ~sel.isin(["true", "false"])
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise _bad_row(path, i, "selected", frame["selected"].iloc[i], "not True or False")


# ------------------------------------------------------------------------------ op-traces

_Count = Annotated[int, Field(strict=True, ge=0)]
_Flops = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]
_Text = Annotated[str, Field(strict=True, max_length=200)]
_Id = Annotated[str, Field(strict=True, pattern=r"^(0|[1-9][0-9]{0,8})$")]


class _OpRow(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Download(_OpRow):
    op: Literal["download"]
    nbytes: _Count
    what: _Text = "model"


class _Upload(_OpRow):
    op: Literal["upload"]
    nbytes: _Count
    what: _Text = "model"


class _Compute(_OpRow):
    op: Literal["compute"]
    flops: _Flops
    batches: _Count
    what: _Text = "train"


class _ServerCompute(_OpRow):
    op: Literal["server_compute"]
    flops: _Flops
    batches: _Count = 0
    what: _Text = "server"


class _Backhaul(_OpRow):
    op: Literal["backhaul"]
    nbytes: _Count
    direction: Literal["up", "down"] = "up"
    what: _Text = "edge_model"


class _Barrier(_OpRow):
    op: Literal["barrier"]
    what: _Text = "decision"


class _Handoff(_OpRow):
    op: Literal["handoff"]
    nbytes: _Count
    from_edge_server: _Count
    what: _Text = "client_state"


_AnyOp = Annotated[
    _Download | _Upload | _Compute | _ServerCompute | _Backhaul | _Barrier | _Handoff,
    Field(discriminator="op"),
]


class _StageLine(BaseModel):
    """A further stage of a round's training (a Flower app's SecAgg+ stages), as timed."""

    model_config = ConfigDict(extra="forbid")
    start_s: float
    time_s: float
    clients: dict[_Id, list[_AnyOp]]


class _TraceLine(BaseModel):
    """One line of ``optraces.jsonl`` as :func:`mecsim.run.round.run_round` writes it."""

    model_config = ConfigDict(extra="forbid")
    round: _Count
    aggregate_flops: _Flops
    selected: list[_Count] | None = None  # older versions did not record it
    clients: dict[_Id, list[_AnyOp]]
    failed: dict[_Id, _Text] = {}
    outage: list[_Count] = []
    stages: list[_StageLine] = []


@dataclass(frozen=True)
class TraceRecord:
    """One round of ``optraces.jsonl``, checked: the selected clients' op-traces in
    selection order, the aggregation's FLOPs, the clients that failed and whose link was
    down."""

    round: int
    aggregate_flops: float
    traces: dict[int, OpTrace]
    failed: dict[int, str]
    outage: frozenset[int]
    #: further stages of the round's training (SecAgg+'s), which a replay does not re-time
    stages: int = 0


def _ops(rows: Iterable[_OpRow]) -> tuple[Op, ...]:
    return tuple(op_from_dict(row.model_dump()) for row in rows)


def read_traces(path: str | Path, clients: int | None = None) -> list[TraceRecord]:
    """``optraces.jsonl``, each line checked (:class:`RecordError` naming the line)."""
    path = Path(path)
    out: list[TraceRecord] = []
    for n, line in enumerate(_text(path).split("\n")[:-1], start=1):
        where = f"{path}:{n}"
        if not line.strip():
            raise RecordError(f"{where}: an empty line")
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RecordError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from None
        except RecursionError:
            raise RecordError(f"{where}: nested too deeply to be a round's op-traces") from None
        if not isinstance(data, dict):
            raise RecordError(f"{where}: a JSON {type(data).__name__}, not an object")
        try:
            row = _TraceLine.model_validate(data)
        except ValidationError as exc:
            raise RecordError(f"{where}: {_problem(exc)}") from None
        if row.round != len(out):
            seen = "a duplicated" if row.round < len(out) else "a missing or reordered"
            raise RecordError(
                f"{where}: round {row.round} where round {len(out)} was expected ({seen} line)"
            )
        ids = [int(c) for c in row.clients]
        if clients is not None and any(c >= clients for c in ids):
            c = max(ids)
            raise RecordError(
                f"{where}: client {c}, but the scenario has {clients} clients "
                "(topology.clients changed?)"
            )
        order = ids
        if row.selected is not None:
            if sorted(row.selected) != sorted(ids) or len(set(row.selected)) != len(ids):
                raise RecordError(
                    f"{where}: selected {row.selected} are not the clients whose traces the "
                    f"line holds ({sorted(ids)})"
                )
            order = list(row.selected)
        failed = {int(c): st for c, st in row.failed.items()}
        if not set(failed) <= set(ids) or not set(row.outage) <= set(ids):
            raise RecordError(f"{where}: failed or outage clients that were not selected")
        by_id = dict(zip(ids, row.clients.values(), strict=True))
        out.append(
            TraceRecord(
                row.round,
                float(row.aggregate_flops),
                {c: _ops(by_id[c]) for c in order},
                failed,
                frozenset(row.outage),
                len(row.stages),
            )
        )
    return out
