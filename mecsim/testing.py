"""The conformance kit: does an algorithm keep the promises mecsim relies on?

:func:`check_algorithm` runs an algorithm (a registered name, an import string, or a name
a plugin file registered) on a tiny scenario, several times, in a temporary folder, and
checks one property at a time (:data:`PROPERTIES`):

``params``
    its ``Params`` is a pydantic model whose fields all have a default and a description,
    and it runs the scenario's rounds in-process;
``determinism``
    the same seed twice gives the same records (``rounds.csv``, ``clients.csv``,
    ``optraces.jsonl``; the columns that measure this machine left out);
``ray``
    in-process and on Ray with 2 host actors give the same records;
``resume``
    a run stopped after round k (its records written, its checkpoint not) and resumed
    from its last checkpoint (what ``mecsim run --resume`` does) gives the uninterrupted
    run's records;
``streaming``
    an algorithm that aggregates in parts (``aggregates_in_parts()``) gives the same
    records streamed and held (``execution.stream_aggregation: off``);
``movable``
    a client class that says its clients keep no state (``movable()``) leaves
    ``ctx.state`` empty after every fit, and the records do not depend on the number of
    hosts (clients lent to other hosts); a hierarchical algorithm's edge state survives
    ``state_dict`` -> checkpoint encoding -> ``load_state_dict`` unchanged;
``optraces``
    every client that trains reports FLOPs (in its result and its op-trace), and the
    bytes its op-trace charges are the bytes of what was sent: the downloads those of
    ``task.weights`` and the arrays in ``task.config``, the uploads those of
    ``result.weights`` and the arrays in ``result.extra`` (serialised payloads, ``bytes``,
    count as arrays; a few bytes more for the numbers in ``extra`` / ``task.config``);
``flops``
    the FLOPs each client's op-trace charges (its ``Compute`` ops, and ``ServerCompute``
    where an edge server trains part of the model in the client's call) are the FLOPs
    its ``fit`` performed: every fit of a separate in-process run is measured whole,
    with ``torch.utils.flop_counter.FlopCounterMode`` (matmuls and convolutions, forward
    and backward) plus ``optimizer_step_flops`` at every optimiser step, and must agree
    within :data:`FLOPS_RTOL`; the first call that does not is named (a cost cache that
    reused one kind of step's cost for another, a custom loop counted by hand). Ops the
    client class lists in ``hand_counted_flops`` (work counted by hand that ``fit`` does
    not run under torch) are left out;
``nan_guard``
    a client whose upload holds NaN is rejected (``rejected`` in ``rounds.csv``,
    ``rejected_nonfinite`` in ``clients.csv``), the server's state stays finite, and the
    later rounds run.

Each property is checked by running the algorithm, never by reading its flags alone, so
each can fail; ``tests/integration/test_conformance.py`` shows the kit catching deliberately broken
algorithms (``tests/data/broken_algorithms.py``). In pytest::

    from mecsim.testing import check_algorithm

    def test_my_algorithm_conforms():
        check_algorithm("my_algorithm", ray=False).assert_ok()

From the shell: ``mecsim check NAME [--plugin FILE] [--scenario FILE] [--json] [--no-ray]``.

The default scenario is :data:`TINY` (the embedded MNIST, 4 clients, the 2NN, 3 rounds;
2 edge servers for a hierarchical algorithm) with :data:`BUILTIN_OVERRIDES` for the
built-ins that need other settings on it. The ``optraces``, ``movable`` and ``nan_guard``
properties wrap the algorithm's classes in subclasses to watch (or poison) what passes
through them: those runs are in-process only.

The pieces the kit is made of serve an author's own tests too (and mecsim's):

- comparing run folders: :func:`assert_same_records` (two runs of one machine, value for
  value), :func:`first_difference` (where they differ, in one line),
  :func:`assert_records_close` (against records another machine wrote, at the stated
  :data:`FLOAT_RTOL` and :data:`LEARNING_RTOL`); all leave out the columns
  :func:`compared_columns` names (those :func:`is_host_column` says a host measures,
  and ``run_id``);
- stopping a run the way a kill would, to test resuming it: :class:`StopAfter` raises
  :class:`SimulatedKill` at the end of a round, after its records are written and before
  its checkpoint; :func:`resume_run` resumes it.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import re
import secrets
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from pydantic import BaseModel
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.flop_counter import FlopCounterMode

from mecsim.agents.algorithms.base import (
    ClientAlgorithm,
    ClientContext,
    ClientResult,
    ClientTask,
    EdgeAlgorithm,
    EdgeReport,
    ServerAlgorithm,
    all_finite,
)
from mecsim.agents.state import decode, encode
from mecsim.agents.training import optimizer_step_flops
from mecsim.emulation.ops import Compute, Download, ServerCompute, Upload
from mecsim.registry import ALGORITHMS, ASYNC_SERVERS, COMPRESSORS, register
from mecsim.run.observers import RunObserver
from mecsim.run.rows import is_host_column
from mecsim.run.setup import streams_aggregation
from mecsim.scenario import Scenario, load_scenario, scenario_from_dict
from mecsim.scenario.aggregation import MODE_SERVERS
from mecsim.store.reader import read_csv_exact
from mecsim.store.runfolder import prepare_resume
from mecsim.store.session import run_in_folder

#: The properties, in the order they are checked and reported.
PROPERTIES: tuple[str, ...] = (
    "params",
    "determinism",
    "ray",
    "resume",
    "streaming",
    "movable",
    "optraces",
    "flops",
    "nan_guard",
)

#: The relative difference allowed between the FLOPs a fit's op-trace charges and the
#: FLOPs measured while it ran (the ``flops`` property): the built-ins charge exactly what
#: they measure; 1 % leaves room for an element-wise term an author counts by hand that
#: the counter does not see, and catches any step charged the cost of another kind.
FLOPS_RTOL = 0.01

#: The default scenario: the tests' tiny one (tests/conftest.py), 3 rounds. A hierarchical
#: algorithm (``server class.Edge`` set) gets 2 edge servers.
#: execution.call_timeout_s of the kit's tiny scenario (s; mecsim check --call-timeout)
CHECK_CALL_TIMEOUT_S = 120.0
TINY: dict[str, Any] = {
    "name": "check",
    "seed": 3,
    "rounds": 3,
    "dataset": {
        "name": "mnist-embedded",
        "train_size": 400,
        "test_size": 100,
        "partition": {"method": "dirichlet", "alpha": 0.5},
    },
    "model": {"name": "mlp_2nn"},
    "topology": {"clients": 4},
    "channel": {"model": "shannon", "interference": {"unit": "noise"}},
    "training": {"epochs": 1, "batch_size": 16, "lr": 0.05},
    "metrics": {"enabled": False},
    # a tiny scenario's calls take milliseconds: a plugin's call that hangs fails its
    # property in two minutes, not the hour of execution.call_timeout_s's default
    "execution": {"backend": "local", "hosts": 2, "call_timeout_s": CHECK_CALL_TIMEOUT_S},
}

_DCPFL_FAST = {
    "warmup_rounds": 2,
    "loss_window": 2,
    "observe_rounds": 1,
    "hold_rounds": 1,
    "gamma_step": 0.3,
}
_DCPFL_DATA = {
    "topology": {"clients": 6},
    "dataset": {
        "name": "mnist-embedded",
        "train_size": 600,
        "test_size": 150,
        "partition": {
            "method": "primary_secondary",
            "samples_per_client": 80,
            "test_samples_per_client": 20,
        },
    },
}
_PHSFL = {
    "model": {"name": "phsfl_cnn"},  # PHSFL splits an nn.Sequential CNN at its cut layer
    "algorithm": {"params": {"edge_rounds": 2, "finetune_steps": 2, "batches_per_epoch": 2}},
}

#: What a built-in needs on top of :data:`TINY` to run (and do its own thing) in 3 rounds,
#: merged into it section by section (``algorithm.params`` included).
BUILTIN_OVERRIDES: dict[str, dict[str, Any]] = {
    # the clustering starts after the warm-up: round 2 of 3 clusters
    "kmeans_cluster": {"algorithm": {"params": {"warmup_rounds": 2, "clusters": 2}}},
    # FedAvg-Adam: private patches, client and server Adam moments (the most state);
    # its clients train with Adam (MTFL Table 1, checked by its check_scenario)
    "mtfl": {
        "algorithm": {"params": {"strategy": "fedavg_adam"}},
        "training": {"optimizer": "adam", "lr": 0.001},
    },
    # dynamic clustering after a 2-round warm-up, on clients with a primary class
    "dcpfl": {**_DCPFL_DATA, "algorithm": {"params": dict(_DCPFL_FAST)}},
    "dcpfl_nola": {**_DCPFL_DATA, "algorithm": {"params": dict(_DCPFL_FAST)}},
    "dcpfl_nodc": {
        **_DCPFL_DATA,
        "algorithm": {"params": {k: v for k, v in _DCPFL_FAST.items() if k != "gamma_step"}},
    },
    # a larger mu selects fewer layers: the layer selection acts within 3 rounds
    "kapc_bls": {"algorithm": {"params": {"mu": 0.3}}},
    "phsfl": _PHSFL,
    "hsfl": _PHSFL,
}

#: Records compared between runs.
RECORD_FILES = ("rounds.csv", "clients.csv", "optraces.jsonl")


# --------------------------------------------------------------------------- the report


@dataclass
class PropertyResult:
    """One property's verdict: ``passed``, why (``reason``, one line), and for a
    comparison that failed, the first record that differs."""

    name: str
    passed: bool
    reason: str
    first_difference: str | None = None
    skipped: bool = False  # not checked (``reason`` says why); counts as passed
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def render(self) -> str:
        word = "SKIP" if self.skipped else ("PASS" if self.passed else "FAIL")
        text = f"{word} {self.name}: {self.reason}"
        if self.first_difference:
            text += f"\n     first difference: {self.first_difference}"
        return text


@dataclass
class CheckReport:
    """What :func:`check_algorithm` found: one :class:`PropertyResult` per property."""

    algorithm: str
    results: list[PropertyResult]
    seconds: float = 0.0
    scenario: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failures(self) -> list[PropertyResult]:
        return [r for r in self.results if not r.passed]

    def result(self, name: str) -> PropertyResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(name)

    def assert_ok(self) -> None:
        """Raise AssertionError listing the failed properties (for pytest)."""
        if not self.ok:
            lines = [r.render() for r in self.failures]
            raise AssertionError(
                f"algorithm {self.algorithm!r} fails {len(lines)} conformance "
                "propert" + ("y" if len(lines) == 1 else "ies") + ":\n" + "\n".join(lines)
            )

    def as_dict(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm,
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "results": [r.as_dict() for r in self.results],
            "scenario": self.scenario,
        }

    def render(self) -> str:
        failed = len(self.failures)
        head = (
            f"mecsim check {self.algorithm}: "
            + (
                "all properties hold"
                if not failed
                else f"{failed} of {len(self.results)} properties fail"
            )
            + f" ({self.seconds:.1f} s)"
        )
        return "\n".join([head, *(r.render() for r in self.results)])

    def __str__(self) -> str:
        return self.render()


class _Fail(Exception):
    """A property does not hold: ``reason`` and maybe the first differing record."""

    def __init__(self, reason: str, first_difference: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.first_difference = first_difference


class _Skip(Exception):
    """A property that does not apply (or was not asked for): the reason."""


# --------------------------------------------------------------------------- records
#
# Two run folders of one machine (a resumed run against an uninterrupted one, a backend
# against the other, before and after a refactor) must hold the same records exactly:
# :func:`assert_same_records`, and :func:`first_difference` to say where they do not.
# Against records written on another machine: :func:`assert_records_close`.


def compared_columns(columns: Iterable[str], ignore: Iterable[str] = ()) -> list[str]:
    """``columns`` without those no comparison of records looks at: the host-measured
    ones (:func:`~mecsim.run.rows.is_host_column`), ``run_id`` (the folder's name) and
    ``ignore``; in their order."""
    skip = {"run_id", *ignore}
    return [c for c in columns if not is_host_column(c) and c not in skip]


def assert_same_records(a: Path, b: Path, ignore: tuple[str, ...] = ()) -> None:
    """Run folders ``a`` and ``b`` hold the same records, value for value: ``rounds.csv``
    and ``clients.csv`` (an asynchronous run's ``updates.csv``), and their Parquet copies
    where either folder has one, equal but
    for the columns :func:`compared_columns` leaves out (and ``ignore``),
    ``optraces.jsonl`` equal byte for byte, ``summary.md`` equal but for its host-time and
    server-memory figures. Raises AssertionError (for pytest) where they differ."""
    per_client = "updates" if (a / "updates.csv").exists() else "clients"
    for name in ("rounds", per_client):
        x, y = read_csv_exact(a / f"{name}.csv"), read_csv_exact(b / f"{name}.csv")
        assert list(x.columns) == list(y.columns)
        cols = compared_columns(x.columns, ignore)
        pd.testing.assert_frame_equal(x[cols], y[cols], check_exact=True)
        if (a / f"{name}.parquet").exists() or (b / f"{name}.parquet").exists():
            px, py = pd.read_parquet(a / f"{name}.parquet"), pd.read_parquet(b / f"{name}.parquet")
            pd.testing.assert_frame_equal(px[cols], py[cols], check_exact=True)
    assert (a / "optraces.jsonl").read_text() == (b / "optraces.jsonl").read_text()
    assert _masked_summary((a / "summary.md").read_text()) == _masked_summary(
        (b / "summary.md").read_text()
    )


def _masked_summary(text: str) -> list[str]:
    """summary.md without the figures that measure this machine: host seconds per round (or
    server version), and the Server mem (MiB) cell of the table whose header names it."""
    text = re.sub(r"[0-9.]+ host seconds per (round|version)", r"H host seconds per \1", text)
    lines = re.sub(r"^# Run .*$", "# Run ID", text, flags=re.M).splitlines()
    for i, line in enumerate(lines):
        if "Server mem (MiB)" in line:
            col = line.split("|").index(" Server mem (MiB) ")
            cells = lines[i + 2].split("|")
            cells[col] = " M "
            lines[i + 2] = "|".join(cells)
    return lines


#: Relative tolerance of float columns against records of another CPU (measured: the
#: golden records on AVX2 kernels differ from the AVX-512 ones that wrote them by at most
#: 2.4e-16 relative, one ulp; a margin of several orders of magnitude).
FLOAT_RTOL = 1e-9
#: Relative tolerance of round 0's losses and accuracies against another CPU's. Measured:
#: tests/data/legacy_runs (written with AVX-512 kernels) against this version's round 0
#: of the same scenario on an AMD EPYC and on an Intel Xeon: mean_test_loss 1.71991 /
#: 1.71991 against 1.72206, 0.125 % both, one round of SGD having grown the kernels'
#: last-bit differences; 1 % is eight times that, and far below what a wrong training
#: (other data, another step, a lost update) moves round 0's loss by.
LEARNING_RTOL = 1e-2


def learning_column(name: str) -> bool:
    """Figures that follow the trained weights' last bits."""
    return "loss" in name or "accuracy" in name


#: What the records of mecsim 0.1 (tests/data/legacy_runs) hold that this version computes
#: otherwise: the energy model (idle/sleep states, transmit draw from tx_power_dbm),
#: the server's aggregation FLOPs (FedAvg's final division counted) and their time (at
#: the edge server's measured aggregation rate), and what follows from those. In rounds
#: recorded by 0.1 these columns are not compared; ``elapsed_s`` carries their round
#: times into every later round, so there it must differ by one constant.
CHANGED_SINCE_0_1 = ("energy", "server_time_s", "server_gflops", "round_time_s")


def assert_records_close(expected: Path, got: Path, old_rounds: int = 0) -> None:
    """``got``'s rounds.csv, clients.csv and optraces.jsonl agree with ``expected``'s,
    which another machine wrote (golden records, old run folders).

    The last bits of floating-point results depend on the CPU: numpy and PyTorch pick
    their kernels by instruction set (AVX-512 or AVX2), and a kernel's order of summation
    with it. So against records written elsewhere, counts, ids, statuses, bytes and
    op-traces must be equal exactly; emulated times, energies and channel draws (floats)
    within a relative :data:`FLOAT_RTOL`; and what follows the trained weights (losses,
    accuracies, :func:`learning_column`), which a few rounds turn a last-bit difference
    into a visibly different number, to :data:`LEARNING_RTOL` in round 0 and only present
    (or NaN) where expected afterwards. Host-measured columns and run ids are not
    compared. Comparisons on one machine (a backend against the other, a resumed run
    against an uninterrupted one, before and after a refactor) stay exact:
    :func:`assert_same_records`.

    ``old_rounds``: ``got``'s first rounds were recorded by mecsim 0.1 and resumed by
    this version: :data:`CHANGED_SINCE_0_1` and the op-traces' ``aggregate_flops`` are
    not compared there (``energy_sleep_j``, added since, must be empty there)."""
    old_x, old_y = _optraces(expected), _optraces(got)
    assert len(old_x) == len(old_y)
    for x, y in zip(old_x, old_y, strict=True):
        if x["round"] < old_rounds:
            x.pop("aggregate_flops"), y.pop("aggregate_flops")
        assert x == y, f"optraces.jsonl round {x['round']}"
    if not old_rounds:
        assert (expected / "optraces.jsonl").read_text() == (got / "optraces.jsonl").read_text()
    for name in ("rounds", "clients"):
        x, y = read_csv_exact(expected / f"{name}.csv"), read_csv_exact(got / f"{name}.csv")
        assert list(x.columns) == list(y.columns), name
        assert len(x) == len(y), name
        for col in compared_columns(x.columns):
            a, b = x[col], y[col]
            where = f"{name}.csv: {col}"
            if old_rounds and col.startswith(CHANGED_SINCE_0_1):
                old = y["round"] < old_rounds
                if col == "energy_sleep_j":
                    assert b[old].isna().all(), where
                a, b = a[~old], b[~old]
            if old_rounds and col == "elapsed_s":
                offset = (b - a).to_numpy()  # the 0.1 rounds' time difference, carried on
                later = (y["round"] >= old_rounds).to_numpy()
                carried = offset[~later][-1]
                np.testing.assert_allclose(offset[later], carried, rtol=FLOAT_RTOL, err_msg=where)
                continue
            if learning_column(col):
                first = x["round"] == 0
                np.testing.assert_allclose(
                    a[first].astype(float),
                    b[first].astype(float),
                    rtol=LEARNING_RTOL,
                    equal_nan=True,
                    err_msg=where,
                )
                assert (a.isna() == b.isna()).all(), where
            elif pd.api.types.is_float_dtype(a) or pd.api.types.is_float_dtype(b):
                np.testing.assert_allclose(
                    a.astype(float),
                    b.astype(float),
                    rtol=FLOAT_RTOL,
                    atol=0,
                    equal_nan=True,
                    err_msg=where,
                )
            else:
                pd.testing.assert_series_equal(a, b, check_exact=True, obj=where)


def _optraces(folder: Path) -> list[dict]:
    with (folder / "optraces.jsonl").open() as f:
        return [json.loads(line) for line in f]


def _fmt(value: Any) -> str:
    """A CSV value as a person reads it (numpy scalars as plain numbers)."""
    if isinstance(value, np.generic):
        value = value.item()
    return repr(value)


def first_difference(a: Path, b: Path, files: Iterable[str] = RECORD_FILES) -> str | None:
    """The first record in which run folders ``a`` and ``b`` differ (host columns left
    out), as one line naming the file, the row (round, client) and the column; None when
    they agree."""
    for name in files:
        pa, pb = a / name, b / name
        if not pa.exists() or not pb.exists():
            missing = pa if not pa.exists() else pb
            return f"{name}: {missing} is missing"
        if name.endswith(".csv"):
            found = _csv_difference(name, pa, pb)
        else:
            found = _jsonl_difference(name, pa, pb)
        if found:
            return found
    return None


def _row_name(df: pd.DataFrame, i: int) -> str:
    """``row 3 (round=1, client_id=2)``: the row and its keys as recorded (``round`` is
    the 0-based record index)."""
    keys = [f"{k}={df[k].iloc[i]}" for k in ("round", "client_id") if k in df.columns]
    return f"row {i}" + (f" ({', '.join(keys)})" if keys else "")


def _csv_difference(name: str, pa: Path, pb: Path) -> str | None:
    x, y = read_csv_exact(pa), read_csv_exact(pb)
    cols_x = compared_columns(x.columns)
    cols_y = compared_columns(y.columns)
    if cols_x != cols_y:
        only = sorted(set(cols_x) ^ set(cols_y))
        return f"{name}: different columns ({', '.join(only) or 'order'})"
    for i in range(min(len(x), len(y))):
        for col in cols_x:
            u, v = x[col].iloc[i], y[col].iloc[i]
            if _scalar_equal(u, v):
                continue
            return f"{name} {_row_name(x, i)} column {col}: {_fmt(u)} vs {_fmt(v)}"
    if len(x) != len(y):
        return f"{name}: {len(x)} rows vs {len(y)} rows"
    return None


def _scalar_equal(u: Any, v: Any) -> bool:
    if pd.isna(u) and pd.isna(v):
        return True
    return bool(u == v)


def _jsonl_difference(name: str, pa: Path, pb: Path) -> str | None:
    la, lb = pa.read_text().splitlines(), pb.read_text().splitlines()
    for i, (u, v) in enumerate(zip(la, lb, strict=False)):
        if u == v:
            continue
        try:
            du, dv = json.loads(u), json.loads(v)
        except ValueError:
            return f"{name} line {i + 1}: {u[:120]!r} vs {v[:120]!r}"
        where = _tree_difference(du, dv, "")
        rnd = du.get("round") if isinstance(du, dict) else None
        at = f"line {i + 1}" + (f" (round={rnd})" if rnd is not None else "")
        return f"{name} {at}, {where}"
    if len(la) != len(lb):
        return f"{name}: {len(la)} lines vs {len(lb)} lines"
    return None


def _tree_difference(u: Any, v: Any, at: str) -> str:
    """Where two JSON trees first differ, and how."""
    if isinstance(u, dict) and isinstance(v, dict):
        for key in list(u) + [k for k in v if k not in u]:
            if key not in u or key not in v:
                return f"{at}.{key}: present in one run only"
            if u[key] != v[key]:
                return _tree_difference(u[key], v[key], f"{at}.{key}")
    if isinstance(u, list) and isinstance(v, list):
        for i, (p, q) in enumerate(zip(u, v, strict=False)):
            if p != q:
                return _tree_difference(p, q, f"{at}[{i}]")
        if len(u) != len(v):
            return f"{at}: {len(u)} items vs {len(v)} items"
    text_u, text_v = json.dumps(u)[:100], json.dumps(v)[:100]
    return f"{at.lstrip('.') or 'value'}: {text_u} vs {text_v}"


def _same_state(a: Any, b: Any, at: str = "state") -> str | None:
    """Where two algorithm states (arrays, tensors, containers, dataclasses, numbers,
    generators) first differ; None when equal value for value and type for type."""
    if type(a) is not type(b):
        return f"{at}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, np.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{at}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        same = np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
        return None if same else f"{at}: values differ"
    if isinstance(a, torch.Tensor):
        return _same_state(a.detach().cpu().numpy(), b.detach().cpu().numpy(), at)
    if isinstance(a, dict):
        if set(a) != set(b):
            return f"{at}: keys {sorted(map(str, set(a) ^ set(b)))} in one only"
        for key in a:
            found = _same_state(a[key], b[key], f"{at}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{at}: {len(a)} items vs {len(b)}"
        for i, (p, q) in enumerate(zip(a, b, strict=True)):
            found = _same_state(p, q, f"{at}[{i}]")
            if found:
                return found
        return None
    if isinstance(a, np.random.Generator):
        same = a.bit_generator.state == b.bit_generator.state
        return None if same else f"{at}: generator states differ"
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return _same_state(vars(a), vars(b), at)
    if isinstance(a, float) and math.isnan(a) and math.isnan(b):
        return None
    try:
        return None if bool(a == b) else f"{at}: {a!r} vs {b!r}"
    except Exception:  # a value whose == is not a truth value
        return f"{at}: cannot compare {type(a).__name__}"


# --------------------------------------------------------------------------- scenarios


#: sections a merge replaces whole
_WHOLE = ("channel", "partition")


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` merged into ``base`` section by section (a ``channel`` or a ``partition``
    is replaced whole: it is a choice of model or method)."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key not in _WHOLE:
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def check_scenario_data(
    name: str,
    scenario: Scenario | str | Path | dict[str, Any] | None = None,
    *,
    validate: bool = False,
) -> dict[str, Any]:
    """The scenario :func:`check_algorithm` runs ``name`` on, as a mapping: ``scenario``
    (a file, a mapping, a Scenario) with its algorithm set to ``name``, or :data:`TINY`
    with :data:`BUILTIN_OVERRIDES` (2 edge servers for a hierarchical algorithm).
    ``validate``: raise :class:`~mecsim.scenario.ScenarioError` if it cannot run."""
    server_cls, _ = ALGORITHMS.get(name)
    if scenario is None:
        data = copy.deepcopy(TINY)
        if server_cls.Edge is not None:
            data["topology"]["edge_servers"] = 2
        data = _merge(data, BUILTIN_OVERRIDES.get(name, {}))
        data["algorithm"] = {"name": name, "params": data.get("algorithm", {}).get("params", {})}
    else:
        if isinstance(scenario, Scenario):
            data = scenario.model_dump(mode="json")
        elif isinstance(scenario, dict):
            data = copy.deepcopy(scenario)
        else:
            data = load_scenario(scenario).model_dump(mode="json")
        algo = dict(data.get("algorithm") or {})
        if algo.get("name") != name:  # another algorithm's parameters do not apply
            algo = {"params": {}}
        data["algorithm"] = {**algo, "name": name}
        data.setdefault("metrics", {})["enabled"] = False
    if validate:
        scenario_from_dict(data, f"mecsim check {name}")
    return data


# --------------------------------------------------------------------------- wrappers


class SimulatedKill(BaseException):
    """Stands for a kill (``kill -9``) in-process: raised by :class:`StopAfter`; not an
    Exception, so nothing in the run loop swallows it."""


class StopAfter(RunObserver):
    """A run observer that stops the run at the end of round ``rnd`` (0-based) by raising
    :class:`SimulatedKill`: the round's records written, its checkpoint not (the worst
    moment for a kill). The run folder is then what a killed run leaves, to be resumed
    with :func:`mecsim.store.runfolder.prepare_resume`::

        with pytest.raises(SimulatedKill):
            run_in_folder(scenario, out, observers=[StopAfter(2)])
    """

    def __init__(self, rnd: int) -> None:
        self.rnd = rnd

    def __repr__(self) -> str:
        return f"StopAfter({self.rnd})"

    def on_round_end(self, info, row, client_rows, traces) -> None:
        if row["round"] == self.rnd:
            raise SimulatedKill()


def resume_run(run_dir: Path, **options: Any) -> int:
    """Resume the stopped run in ``run_dir`` from its newest readable checkpoint and run it
    to its end, as ``mecsim run --resume`` does; returns the number of rounds that
    checkpoint holds (the round the resumed run began with). ``options`` go to
    :func:`~mecsim.store.session.run_in_folder` (``hosts``, ``backend``, ``observers``)."""
    target = prepare_resume(run_dir)
    try:
        run_in_folder(None, resume=target, **options)
    finally:
        target.lock.release()
    return target.rounds_done


def _nbytes(value: Any) -> int:
    """Bytes of the arrays, tensors and serialised payloads (``bytes``) in ``value``
    (containers walked)."""
    if isinstance(value, bytes | bytearray):
        return len(value)
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, torch.Tensor):
        return int(value.numel() * value.element_size())
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


def _numbers(value: Any) -> int:
    """How many plain numbers (not in arrays) ``value`` holds: each may be sent as a few
    bytes (a loss, a count), which the op-trace may charge or not."""
    if isinstance(value, bool | int | float | np.number):
        return 1
    if isinstance(value, dict):
        return sum(_numbers(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_numbers(v) for v in value)
    return 0


#: bytes allowed per plain number of ``extra`` / ``task.config`` (a float64 or an int64)
NUMBER_BYTES = 8


@dataclass
class _Probe:
    """What the wrapped classes saw in one in-process run."""

    rnd: int = -1  # the round the server last planned
    servers: list[ServerAlgorithm] = field(default_factory=list)
    edges: list[EdgeAlgorithm] = field(default_factory=list)
    fits: int = 0
    state_left: list[str] = field(default_factory=list)  # movable clients with ctx.state
    trace_problems: list[str] = field(default_factory=list)
    edge_problems: list[str] = field(default_factory=list)
    # what each round's clients were sent: round -> digest of task.weights -> clients
    downloads: dict[int, dict[str, list[int]]] = field(default_factory=dict)
    poison_round: int | None = None
    poisoned: tuple[int, int] | None = None  # (round, client) whose upload became NaN
    measure_flops: bool = False  # count each fit's FLOPs while it runs (``flops``)
    flop_checks: int = 0  # fits whose FLOPs were measured
    flop_problems: list[str] = field(default_factory=list)


def _check_fit(probe: _Probe, rnd: int, task: ClientTask, result: ClientResult) -> None:
    """Op-trace completeness of one client's round (see the module docstring)."""
    who = f"round {rnd + 1} client {result.client_id}"
    ups = sum(op.nbytes for op in result.trace if isinstance(op, Upload))
    downs = sum(op.nbytes for op in result.trace if isinstance(op, Download))
    computes = sum(op.flops for op in result.trace if isinstance(op, Compute))
    problems = probe.trace_problems
    if result.num_samples > 0 and not result.flops > 0:
        problems.append(f"{who} trained on {result.num_samples} samples but reports flops = 0")
    if result.num_samples > 0 and not computes > 0:
        problems.append(f"{who} trained but its op-trace has no compute with FLOPs > 0")
    if any(isinstance(op, ServerCompute) for op in result.trace):
        # split learning: the client's returned model holds parts its edge server trained
        # and keeps; only something must be charged for what moves
        if result.weights is not None and ups <= 0:
            problems.append(f"{who} uploads a model but its op-trace charges no upload")
        if task.weights is not None and downs <= 0:
            problems.append(f"{who} was sent a model but its op-trace charges no download")
        return
    sent_up = _nbytes(result.weights) + _nbytes(result.extra)
    slack_up = NUMBER_BYTES * _numbers(result.extra)
    for what, charged in (("its op-trace's uploads", ups), ("upload_nbytes", result.upload_nbytes)):
        if not sent_up <= charged <= sent_up + slack_up:
            problems.append(
                f"{who}: {what} charge {charged} bytes, but it sent {sent_up} bytes "
                "(result.weights and the arrays in result.extra)"
            )
    sent_down = _nbytes(task.weights) + _nbytes(task.config)
    slack_down = NUMBER_BYTES * _numbers(task.config)
    for what, charged in (
        ("its op-trace's downloads", downs),
        ("task.download_nbytes", task.download_nbytes),
    ):
        if not sent_down <= charged <= sent_down + slack_down:
            problems.append(
                f"{who}: {what} charge {charged} bytes, but task.weights and the arrays "
                f"in task.config hold {sent_down} bytes"
            )


class _FitFlops:
    """The FLOPs of everything run in a ``with`` block on this thread: the counter's
    matmuls and convolutions (nested counters, e.g. :func:`measured_step`'s, count too),
    and every optimiser step's :func:`optimizer_step_flops` (a global step hook: it also
    turns off :func:`~mecsim.agents.training.optimizer_step`'s direct SGD update, so
    every step passes through ``Optimizer.step``)."""

    def __init__(self) -> None:
        self.optimizer_flops = 0.0
        self.counter = FlopCounterMode(display=False)
        self._hook: Any = None

    def _on_step(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        self.optimizer_flops += optimizer_step_flops(optimizer)

    @property
    def flops(self) -> float:
        return float(self.counter.get_total_flops()) + self.optimizer_flops

    def __enter__(self) -> _FitFlops:
        self._hook = register_optimizer_step_pre_hook(self._on_step)
        self.counter.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.counter.__exit__(*exc)
        self._hook.remove()


def _check_flops(
    probe: _Probe, rnd: int, result: ClientResult, measured: float, by_hand: tuple[str, ...]
) -> None:
    """The FLOPs ``result``'s op-trace charges against ``measured`` (see ``flops``); ops
    whose ``what`` is in ``by_hand`` (the client class's ``hand_counted_flops``) left
    out."""
    charged = sum(
        op.flops
        for op in result.trace
        if isinstance(op, (Compute, ServerCompute)) and op.what not in by_hand
    )
    probe.flop_checks += 1
    if not math.isclose(charged, measured, rel_tol=FLOPS_RTOL):
        off = (charged - measured) / measured if measured else math.inf
        probe.flop_problems.append(
            f"round {rnd + 1} client {result.client_id}: its op-trace charges "
            f"{charged:.6g} FLOPs, but its fit performed {measured:.6g} "
            f"({off:+.1%}; FlopCounterMode and the optimiser steps) - a cost cached for "
            "one kind of step reused for another? (cost_key, docs/extending.md)"
        )


def _observed_pair(
    server_cls: type[ServerAlgorithm],
    client_cls: type[ClientAlgorithm],
    probe: _Probe,
) -> tuple[type[ServerAlgorithm], type[ClientAlgorithm]]:
    """Subclasses of the algorithm's classes that tell ``probe`` what passes through them
    (and poison one upload with NaN when ``probe.poison_round`` is set). The flags that
    are not inherited (``keeps_no_state``, ``streams_aggregation``) keep their values."""
    edge_cls = server_cls.Edge

    class ObservedServer(server_cls):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            probe.servers.append(self)

        def configure_fit(self, rnd: int, selected: list[int]) -> list[ClientTask]:
            probe.rnd = rnd
            return super().configure_fit(rnd, selected)

    if edge_cls is not None:

        class ObservedEdge(edge_cls):  # type: ignore[valid-type,misc]
            _fresh = False  # an instance made only to load a state into

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                if not type(self)._fresh:
                    probe.edges.append(self)

            def aggregate_fit(self, rnd: int, results: list[ClientResult]) -> EdgeReport:
                report = super().aggregate_fit(rnd, results)
                self._round_trip(rnd)
                return report

            def _round_trip(self, rnd: int) -> None:
                state = self.state_dict()
                try:
                    type(self)._fresh = True
                    fresh = type(self)(
                        self.edge_server,
                        self.layout,
                        self.client_samples,
                        self.params.model_dump(),
                    )
                finally:
                    type(self)._fresh = False
                try:
                    fresh.load_state_dict(decode(encode(copy.deepcopy(state), "edge")))
                    where = _same_state(state, fresh.state_dict(), "edge state")
                except Exception as exc:  # a state the checkpoint cannot hold
                    where = f"{type(exc).__name__}: {exc}"
                if where:
                    probe.edge_problems.append(
                        f"round {rnd + 1} edge server {self.edge_server}: state_dict -> "
                        f"checkpoint -> load_state_dict changes it ({where})"
                    )

        ObservedServer.Edge = ObservedEdge

    movable = client_cls.movable()

    class ObservedClient(client_cls):  # type: ignore[valid-type,misc]
        keeps_no_state = movable  # not inherited (see ClientAlgorithm.movable)

        def fit(self, ctx: ClientContext, task: ClientTask) -> ClientResult:
            before = set(ctx.state)
            if probe.measure_flops:
                with _FitFlops() as counted:
                    result = super().fit(ctx, task)
                by_hand = tuple(getattr(self, "hand_counted_flops", ()))
                _check_flops(probe, probe.rnd, result, counted.flops, by_hand)
            else:
                result = super().fit(ctx, task)
            rnd = probe.rnd
            probe.fits += 1
            if movable and ctx.state:
                probe.state_left.append(
                    f"round {rnd + 1} client {ctx.client_id} left {sorted(ctx.state)} in "
                    f"ctx.state (before the fit: {sorted(before) or 'empty'})"
                )
            _check_fit(probe, rnd, task, result)
            if task.weights is not None:
                digest = hashlib.sha256(np.ascontiguousarray(task.weights).tobytes()).hexdigest()
                probe.downloads.setdefault(rnd, {}).setdefault(digest, []).append(ctx.client_id)
            if (
                probe.poison_round is not None
                and rnd == probe.poison_round
                and probe.poisoned is None
            ):
                if _poison(result):
                    probe.poisoned = (rnd, ctx.client_id)
            return result

    for cls, like in ((ObservedServer, server_cls), (ObservedClient, client_cls)):
        cls.__name__ = cls.__qualname__ = f"Observed{like.__name__}"
        cls.__module__ = __name__
    return ObservedServer, ObservedClient


def _poison(result: ClientResult) -> bool:
    """Put a NaN into what the client uploads (a copy: the client may keep its own);
    False when it uploads nothing that can hold one, or when the result is of an
    evaluation (a batch of evaluate messages that a server driving its rounds sent after
    the aggregation: its op-trace computes only ``what="evaluate"``)."""
    computes = [op for op in result.trace if isinstance(op, Compute)]
    if computes and all(op.what == "evaluate" for op in computes):
        return False
    if isinstance(result.weights, np.ndarray) and result.weights.dtype.kind == "f":
        bad = np.array(result.weights, copy=True)
        bad.reshape(-1)[0] = np.nan
        result.weights = bad
        return True
    for key, value in result.extra.items():
        if isinstance(value, np.ndarray) and value.dtype.kind == "f" and value.size:
            bad = np.array(value, copy=True)
            bad.reshape(-1)[0] = np.nan
            result.extra[key] = bad
            return True
        if isinstance(value, float):
            result.extra[key] = float("nan")
            return True
    return False


# --------------------------------------------------------------------------- the kit


class _Kit:
    """The runs of one check, in one temporary folder, and the properties read off them."""

    def __init__(self, name: str, data: dict[str, Any], folder: Path, ray: bool) -> None:
        self.name = name
        self.data = data
        self.folder = folder
        self.ray = ray
        self.server_cls, self.client_cls = ALGORITHMS.get(name)
        self.rounds = int(data["rounds"])
        self._base: Path | None = None
        self._base_error: str | None = None
        self._observed: tuple[_Probe, Path] | None = None
        self._observed_error: str | None = None

    # -- runs

    def _scenario(self, **over: Any) -> Scenario:
        return scenario_from_dict(_merge(self.data, over), f"mecsim check {self.name}")

    def _run(
        self,
        label: str,
        *,
        backend: str = "local",
        hosts: int = 1,
        observers: tuple[RunObserver, ...] = (),
        **over: Any,
    ) -> Path:
        out = self.folder / label
        outcome = run_in_folder(
            self._scenario(**over),
            out,
            observers=observers,
            backend=backend,
            hosts=hosts,
        )
        if outcome.status != "finished" or len(outcome.rows) != self.rounds:
            raise _Fail(
                f"the {label} run ended {outcome.status} after {len(outcome.rows)} of "
                f"{self.rounds} rounds"
            )
        return out

    def _try(self, label: str, **kwargs: Any) -> Path:
        """:meth:`_run`, a failure of the run itself a failed property."""
        try:
            return self._run(label, **kwargs)
        except _Fail:
            raise
        except Exception as exc:
            raise _Fail(f"the {label} run failed: {_one_line(exc)}") from None

    def base(self) -> Path:
        """The in-process run every comparison is against: one host, so that no client
        is lent to another (the ``movable`` property compares 2 and 3 hosts with it)."""
        if self._base is None and self._base_error is None:
            try:
                self._base = self._try("base")
            except _Fail as exc:
                self._base_error = exc.reason
        if self._base is None:
            raise _Fail(f"cannot compare: {self._base_error}")
        return self._base

    def _compare(self, other: Path, what: str) -> str:
        diff = first_difference(self.base(), other)
        if diff:
            raise _Fail(f"{what}: the records differ", diff)
        return f"{what}: identical records"

    def observed(self) -> tuple[_Probe, Path]:
        """One in-process run with the classes wrapped to watch what passes through them."""
        if self._observed is None and self._observed_error is None:
            try:
                self._observed = self._wrapped_run("observed", _Probe())
            except _Fail as exc:
                self._observed_error = exc.reason
        if self._observed is None:
            raise _Fail(f"cannot watch the algorithm: {self._observed_error}")
        return self._observed

    def _wrapped_run(self, label: str, probe: _Probe, **over: Any) -> tuple[_Probe, Path]:
        pair = _observed_pair(self.server_cls, self.client_cls, probe)
        wrapped = f"check-{label}-{secrets.token_hex(4)}"
        ALGORITHMS.register(wrapped, pair)
        try:
            algo = {**self.data["algorithm"], "name": wrapped}
            return probe, self._try(label, algorithm=algo, **over)
        finally:
            ALGORITHMS.unregister(wrapped)

    # -- the properties

    def check_params(self) -> str:
        problems: list[str] = []
        params = self.server_cls.Params
        if not (isinstance(params, type) and issubclass(params, BaseModel)):
            raise _Fail(f"{self.server_cls.__name__}.Params is not a pydantic model")
        if self.client_cls.Params is not params:
            problems.append(
                f"the client class's Params ({self.client_cls.Params.__name__}) is not the "
                f"server class's ({params.__name__})"
            )
        for fname, info in params.model_fields.items():
            if info.is_required():
                problems.append(f"field {fname!r} has no default")
            if not (info.description or "").strip():
                problems.append(f"field {fname!r} has no description")
        # what a scenario must give, said by the Params class itself (a Flower app: which
        # app runs): then the defaults alone need not validate
        must_give = str(getattr(params, "must_give", "") or "")
        try:
            params()
        except Exception as exc:  # the defaults themselves do not validate
            if not must_give:
                problems.append(f"{params.__name__}() with the defaults fails: {_one_line(exc)}")
        if problems:
            raise _Fail("; ".join(problems))
        try:
            self.base()
        except _Fail:
            raise _Fail(self._base_error or "the in-process run failed") from None
        n = len(params.model_fields)
        given = f" (a scenario must give {must_give})" if must_give else ""
        return (
            f"{params.__name__}: {n} field{'s' if n != 1 else ''}, each with a default and "
            f"a description{given}; {self.rounds} rounds ran in-process"
        )

    def check_determinism(self) -> str:
        self.base()
        return self._compare(self._try("again"), "two runs with the same seed")

    def check_ray(self) -> str:
        if not self.ray:
            raise _Skip("not asked for (ray=False / --no-ray)")
        self.base()
        other = self._try("ray", backend="ray", hosts=2)
        return self._compare(other, "in-process and on Ray with 2 hosts")

    def check_resume(self) -> str:
        if self.rounds < 2:
            raise _Skip("the scenario has 1 round: nothing to resume")
        if not self.server_cls.checkpointable:
            raise _Skip(
                f"the server's state cannot be checkpointed ({self.server_cls.checkpoint_refusal}):"
                " its scenarios are refused with checkpoints, nothing resumes"
            )
        self.base()
        stop_at = max(1, self.rounds // 2)  # 0-based: the round whose checkpoint is lost
        out = self.folder / "resumed"
        try:
            run_in_folder(
                self._scenario(), out, observers=[StopAfter(stop_at)], backend="local", hosts=1
            )
        except SimulatedKill:
            pass
        except Exception as exc:
            raise _Fail(f"the run to be interrupted failed: {_one_line(exc)}") from None
        else:
            raise _Fail(f"the run was not stopped after round {stop_at + 1}")
        try:
            target = prepare_resume(out)
        except Exception as exc:
            raise _Fail(f"the stopped run cannot be resumed: {_one_line(exc)}") from None
        try:
            done = target.rounds_done
            run_in_folder(None, resume=target, hosts=1, backend="local")
        except Exception as exc:
            raise _Fail(f"the resumed run failed: {_one_line(exc)}") from None
        finally:
            target.lock.release()
        return self._compare(
            out,
            f"stopped after round {stop_at + 1}, resumed from the checkpoint after round "
            f"{done}, against the uninterrupted run",
        )

    def check_streaming(self) -> str:
        if not self.server_cls.aggregates_in_parts():
            raise _Skip("the server class does not aggregate in parts (streams_aggregation)")
        if not streams_aggregation(self._scenario()):
            raise _Skip(
                "the algorithm streams, but not in this scenario (an edge side, a deadline, "
                "outages or rate traces decide its aggregation from the timing)"
            )
        self.base()
        held = self._try("held", execution={"stream_aggregation": "off"})
        return self._compare(held, "streamed and held (stream_aggregation: off)")

    def check_movable(self) -> str:
        said: list[str] = []
        if self.client_cls.movable():
            probe, _ = self.observed()
            if probe.state_left:
                raise _Fail(
                    f"{self.client_cls.__name__} says its clients keep no state "
                    f"(keeps_no_state), but {probe.state_left[0]}"
                    + (
                        f" (and {len(probe.state_left) - 1} more)"
                        if len(probe.state_left) > 1
                        else ""
                    )
                )
            said.append(f"ctx.state stayed empty after all {probe.fits} fits")
        else:
            said.append("clients keep state (keeps_no_state not set): never lent")
        if self.server_cls.Edge is not None:
            probe, _ = self.observed()
            if probe.edge_problems:
                raise _Fail(probe.edge_problems[0])
            if not probe.edges:
                raise _Fail("the hierarchical algorithm's edge servers never ran")
            said.append(
                f"{len(probe.edges)} edge servers' states round-trip through the "
                "checkpoint encoding unchanged"
            )
        self.base()
        for hosts in (2, 3):
            other = self._try(f"hosts{hosts}", hosts=hosts)
            diff = first_difference(self.base(), other)
            if diff:
                raise _Fail(f"records on {hosts} hosts and on 1 host differ", diff)
        said.append("records on 1, 2 and 3 hosts identical")
        return "; ".join(said)

    def check_optraces(self) -> str:
        probe, _ = self.observed()
        if not probe.fits:
            raise _Fail("no client trained in the observed run")
        if probe.trace_problems:
            more = len(probe.trace_problems) - 1
            raise _Fail(probe.trace_problems[0] + (f" (and {more} more)" if more > 0 else ""))
        said = (
            f"{probe.fits} client rounds: FLOPs > 0 in results and op-traces, bytes charged "
            "= bytes sent both ways"
        )
        if self.server_cls.personalised_downloads:
            return said + "; downloads personalised (unicasts)"
        for rnd, sent in sorted(probe.downloads.items()):
            if len(sent) > 1:
                a, b = (min(clients) for clients in list(sent.values())[:2])
                raise _Fail(
                    f"personalised_downloads is not set (one broadcast a round is timed), "
                    f"but in round {rnd + 1} clients {min(a, b)} and {max(a, b)} were sent "
                    "different models"
                )
        return said + "; every round's clients were sent one model (a broadcast)"

    def check_flops(self) -> str:
        probe, _ = self._wrapped_run("flops", _Probe(measure_flops=True))
        if not probe.flop_checks:
            raise _Fail("no client trained in the measured run")
        if probe.flop_problems:
            more = len(probe.flop_problems) - 1
            raise _Fail(probe.flop_problems[0] + (f" (and {more} more)" if more > 0 else ""))
        by_hand = tuple(self.client_cls.hand_counted_flops)
        left_out = f" (left out, counted by hand: {', '.join(by_hand)})" if by_hand else ""
        return (
            f"{probe.flop_checks} fits measured whole (FlopCounterMode and every optimiser "
            f"step): the FLOPs their op-traces charge agree within {FLOPS_RTOL:.0%}" + left_out
        )

    def check_nan_guard(self) -> str:
        if self.rounds < 2:
            raise _Skip("the scenario has 1 round: no round after the poisoned one")
        probe = _Probe(poison_round=1 if self.rounds >= 3 else 0)
        _, out = self._wrapped_run("nan", probe)
        if probe.poisoned is None:
            raise _Skip(
                f"no client uploaded anything that can hold a NaN in round "
                f"{(probe.poison_round or 0) + 1}"
            )
        rnd, cid = probe.poisoned
        rounds = read_csv_exact(out / "rounds.csv")
        clients = read_csv_exact(out / "clients.csv")
        row = rounds[rounds["round"] == rnd]
        if row.empty or int(row["rejected"].iloc[0]) < 1:
            got = "no row" if row.empty else f"rejected = {int(row['rejected'].iloc[0])}"
            raise _Fail(
                f"client {cid}'s upload held NaN in round {rnd + 1}, but rounds.csv has {got}"
            )
        mine = clients[(clients["round"] == rnd) & (clients["client_id"] == cid)]
        status = mine["status"].iloc[0] if not mine.empty else "no row"
        if status != "rejected_nonfinite":
            raise _Fail(
                f"client {cid}'s upload held NaN in round {rnd + 1}, but its clients.csv "
                f"status is {status!r}, not 'rejected_nonfinite'"
            )
        # the state the run's server (the last one made: the pre-flight makes one too)
        # and edge servers end with holds no NaN or inf an unpoisoned run's does not
        # (some algorithms keep NaN on purpose, e.g. a statistic not defined yet)
        clean, _ = self.observed()
        for what, poisoned, reference in _final_states(probe, clean):
            extra = _nonfinite_paths(poisoned) - _nonfinite_paths(reference)
            if extra:
                raise _Fail(
                    f"client {cid}'s NaN upload in round {rnd + 1} reached {what}: "
                    f"{sorted(extra)[0]} is not finite (it is in a run without the NaN)"
                )
        later = rounds[rounds["round"] > rnd]
        acc = later["mean_accuracy"].dropna() if "mean_accuracy" in later else later
        if len(later) != self.rounds - rnd - 1:
            raise _Fail(f"the rounds after the NaN did not all run ({len(later)} ran)")
        if "mean_accuracy" in later and not np.isfinite(acc.to_numpy(dtype=float)).all():
            raise _Fail("a later round's mean accuracy is not finite")
        return (
            f"client {cid}'s NaN upload in round {rnd + 1} was rejected, the server's state "
            f"stayed finite, {len(later)} later round(s) ran"
        )


def _final_states(poisoned: _Probe, clean: _Probe) -> list[tuple[str, Any, Any]]:
    """(what, its state in the poisoned run, in the clean run) for the server and each
    edge server (the last instance made of each)."""
    out: list[tuple[str, Any, Any]] = []
    if poisoned.servers and clean.servers:
        out.append(
            (
                "the server's state",
                poisoned.servers[-1].state_dict(),
                clean.servers[-1].state_dict(),
            )
        )
    edges = {e.edge_server: e for e in clean.edges}
    for edge in {e.edge_server: e for e in poisoned.edges}.values():
        if edge.edge_server in edges:
            out.append(
                (
                    f"edge server {edge.edge_server}'s state",
                    edge.state_dict(),
                    edges[edge.edge_server].state_dict(),
                )
            )
    return out


def _nonfinite_paths(value: Any, at: str = "state") -> set[str]:
    """Where ``value`` (a state: containers of arrays, tensors, numbers) holds NaN or inf."""
    if isinstance(value, dict):
        return {p for k, v in value.items() for p in _nonfinite_paths(v, f"{at}[{k!r}]")}
    if isinstance(value, (list, tuple)):
        return {p for i, v in enumerate(value) for p in _nonfinite_paths(v, f"{at}[{i}]")}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _nonfinite_paths(vars(value), at)
    return set() if all_finite(value) else {at}


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _one_line(exc: BaseException) -> str:
    """``Type: message`` on one line; of a Ray task's error, its cause's."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        exc = cause
    text = " ".join(_ANSI.sub("", str(exc)).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:400]


def check_algorithm(
    name: str,
    scenario: Scenario | str | Path | dict[str, Any] | None = None,
    *,
    ray: bool = True,
    properties: Iterable[str] | None = None,
    workdir: str | Path | None = None,
    on_result: Callable[[PropertyResult], None] | None = None,
    call_timeout_s: float | None = None,
) -> CheckReport:
    """Check algorithm ``name`` (see the module docstring) and return the report.

    ``scenario`` replaces the default tiny one (its algorithm set to ``name``); ``ray``
    False skips the comparison with Ray; ``properties`` checks only those of
    :data:`PROPERTIES` (the others are reported skipped). The runs go to a temporary
    folder removed at the end, or to ``workdir`` (kept, for a look at the records).
    ``on_result`` is called with each property's result as soon as it is known.
    ``call_timeout_s``: the runs' ``execution.call_timeout_s`` (default: the scenario's;
    the tiny one's is :data:`CHECK_CALL_TIMEOUT_S`): a call of the algorithm that has not
    returned by then fails the property, naming the call.

    Raises :class:`~mecsim.registry.UnknownName` / :class:`~mecsim.registry.PluginError`
    for a name that does not resolve and :class:`~mecsim.scenario.ScenarioError` for a
    scenario that cannot run the algorithm (bad input, before anything runs).
    """
    wanted = list(PROPERTIES if properties is None else properties)
    unknown = [p for p in wanted if p not in PROPERTIES]
    if unknown:
        raise ValueError(f"unknown properties {unknown}; known: {', '.join(PROPERTIES)}")
    ALGORITHMS.get(name)  # UnknownName / PluginError first
    data = check_scenario_data(name, scenario, validate=True)  # ScenarioError: no run
    if call_timeout_s is not None:
        if not (math.isfinite(call_timeout_s) and call_timeout_s > 0):
            raise ValueError(f"call_timeout_s must be a time > 0 (s), got {call_timeout_s!r}")
        data = _merge(data, {"execution": {"call_timeout_s": float(call_timeout_s)}})
    start = time.perf_counter()
    results: list[PropertyResult] = []
    with tempfile.TemporaryDirectory(prefix="mecsim-check-") as tmp:
        folder = Path(workdir) if workdir is not None else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        kit = _Kit(name, data, folder, ray)
        for prop in PROPERTIES:
            t0 = time.perf_counter()
            if prop not in wanted:
                result = PropertyResult(prop, True, "not asked for", skipped=True)
            else:
                try:
                    reason = getattr(kit, f"check_{prop}")()
                    result = PropertyResult(prop, True, reason)
                except _Skip as exc:
                    result = PropertyResult(prop, True, str(exc), skipped=True)
                except _Fail as exc:
                    result = PropertyResult(prop, False, exc.reason, exc.first_difference)
                except Exception as exc:  # the kit's own run of the algorithm blew up
                    result = PropertyResult(prop, False, _one_line(exc))
                except KeyboardInterrupt:
                    raise
                except BaseException as exc:  # sys.exit() or a BaseException of its own,
                    # from the algorithm's code where the kit calls it itself: a failure
                    what = " ".join(repr(exc).split())[:300]
                    result = PropertyResult(prop, False, f"raised {what} (user code)")
            result.seconds = round(time.perf_counter() - t0, 3)
            results.append(result)
            if on_result is not None:
                on_result(result)
    return CheckReport(name, results, time.perf_counter() - start, data)


# --------------------------------------------------------------------------- compressors

#: The properties of a compressor (:func:`check_compressor`), in the order checked.
COMPRESSOR_PROPERTIES: tuple[str, ...] = ("params", "roundtrip", "bytes", "determinism", "resume")


def _compressor_vectors() -> list[tuple[str, np.ndarray]]:
    """What the kit encodes: sizes that fill no block evenly, a single value, constant and
    zero vectors, outliers, tiny and large magnitudes, an update-like vector."""
    rng = np.random.default_rng(20261129)
    outliers = rng.normal(0, 0.01, 4097).astype(np.float32)
    outliers[[7, 2000]] = [5.0, -3.0]
    return [
        ("normal(0, 1) x 1000", rng.normal(0, 1, 1000).astype(np.float32)),
        ("one value", np.array([0.75], np.float32)),
        ("constant x 300", np.full(300, -2.5, np.float32)),
        ("zeros x 257", np.zeros(257, np.float32)),
        ("normal(0, 0.01) x 4097 with two outliers", outliers),
        ("normal(0, 1e-8) x 999", rng.normal(0, 1e-8, 999).astype(np.float32)),
        ("normal(0, 1e4) x 999", rng.normal(0, 1e4, 999).astype(np.float32)),
    ]


def _norm(v: np.ndarray, which: str) -> float:
    v = v.astype(np.float64)
    return float(np.max(np.abs(v))) if which == "linf" and v.size else float(np.linalg.norm(v))


class _CompressorKit:
    def __init__(self, name: str, params: dict[str, Any], folder: Path) -> None:
        self.name, self.params, self.folder = name, dict(params), folder
        self.cls = COMPRESSORS.get(name)
        self.data = _merge(TINY, {"compressor": {"name": name, "params": self.params}})
        self._base: Path | None = None

    def fresh(self) -> Any:
        return self.cls(dict(self.params))

    def _run(self, label: str, **kwargs: Any) -> Path:
        out = self.folder / label
        sc = scenario_from_dict(self.data, f"mecsim check {self.name}")
        try:
            outcome = run_in_folder(sc, out, backend="local", hosts=1, **kwargs)
        except Exception as exc:
            raise _Fail(f"the {label} run (FedAvg with it) failed: {_one_line(exc)}") from None
        if outcome.status != "finished":
            raise _Fail(f"the {label} run ended {outcome.status}")
        return out

    def base(self) -> Path:
        if self._base is None:
            self._base = self._run("base")
        return self._base

    def check_params(self) -> str:
        params = getattr(self.cls, "Params", None)
        if not (isinstance(params, type) and issubclass(params, BaseModel)):
            raise _Fail("its Params is not a pydantic model")
        problems = [
            f"{field}: " + ("no default" if info.is_required() else "no description")
            for field, info in params.model_fields.items()
            if info.is_required() or not info.description
        ]
        if problems:
            raise _Fail("Params fields without " + "; ".join(problems))
        self.fresh()
        return f"{len(params.model_fields)} documented fields, built with {self.params or '{}'}"

    def check_roundtrip(self) -> str:
        comp = self.fresh()
        norm = getattr(comp, "error_norm", "l2")
        if norm not in ("l2", "linf"):
            raise _Fail(f"error_norm is {norm!r}, not 'l2' or 'linf'")
        for label, x in _compressor_vectors():
            for seed in (0, 1, 2**63 + 5):
                back = comp.decode(comp.encode(x, seed))
                if not (
                    isinstance(back, np.ndarray)
                    and back.shape == x.shape
                    and back.dtype == np.float32
                ):
                    raise _Fail(f"{label}, seed {seed}: decode did not return {x.size} float32")
                err, bound = _norm(back - x, norm), float(comp.error_bound(x))
                if not err <= bound:
                    raise _Fail(
                        f"{label}, seed {seed}: the {norm} error {err:.6g} exceeds the "
                        f"stated error_bound {bound:.6g}"
                    )
        return f"{len(_compressor_vectors())} vectors x 3 seeds within error_bound ({norm})"

    def check_bytes(self) -> str:
        comp = self.fresh()
        for label, x in _compressor_vectors():
            payload = comp.encode(x, 11)
            if not isinstance(payload, bytes):
                raise _Fail(f"{label}: encode returned {type(payload).__name__}, not bytes")
            stated = comp.encoded_nbytes(x.size)
            if stated is not None and stated != len(payload):
                raise _Fail(
                    f"{label}: encoded_nbytes({x.size}) says {stated} bytes, encode gave "
                    f"{len(payload)}"
                )
            # everything the server needs travels: a fresh instance decodes a copy alike
            again = self.fresh().decode(bytes(bytearray(payload)))
            if not np.array_equal(again, comp.decode(payload)):
                raise _Fail(
                    f"{label}: a fresh instance decodes the payload differently: decode "
                    "reads something that is not in the payload (and is not charged)"
                )
        run = self.base()
        n = int(json.loads((run / "run.json").read_text())["num_params"])
        raw = 4 * n
        for line in _optraces(run):
            for cid, ops in line["clients"].items():
                ups = [op["nbytes"] for op in ops if op["op"] == "upload"]
                stated = comp.encoded_nbytes(n)
                if len(ups) != 1 or (stated is not None and ups[0] != stated):
                    raise _Fail(
                        f"round {line['round'] + 1} client {cid}: uploads {ups} bytes, the "
                        f"payload of {n} values is {stated}"
                    )
        return (
            f"payloads are bytes, decoded from themselves alone; a FedAvg run's uploads "
            f"charge {comp.encoded_nbytes(n) or 'the payload'} bytes (raw: {raw})"
        )

    def check_determinism(self) -> str:
        for label, x in _compressor_vectors():
            if self.fresh().encode(x, 5) != self.fresh().encode(x, 5):
                raise _Fail(f"{label}: two encodings with seed 5 differ")
        other = self._run("again")
        diff = first_difference(self.base(), other)
        if diff:
            raise _Fail("a FedAvg run with it twice: the records differ", diff)
        return "the same seed, the same payload; a FedAvg run twice: identical records"

    def check_resume(self) -> str:
        out = self.folder / "resumed"
        sc = scenario_from_dict(self.data, f"mecsim check {self.name}")
        try:
            run_in_folder(sc, out, observers=[StopAfter(1)], backend="local", hosts=1)
        except SimulatedKill:
            pass
        target = prepare_resume(out)
        try:
            run_in_folder(None, resume=target, hosts=1, backend="local")
        finally:
            target.lock.release()
        diff = first_difference(self.base(), out)
        if diff:
            raise _Fail(
                "stopped after round 2 and resumed: the records differ from the "
                "uninterrupted run's (a residual not restored?)",
                diff,
            )
        keeps = " (its residuals restored)" if self.fresh().keeps_residual else ""
        return f"stopped after round 2, resumed{keeps}: identical records"


def check_compressor(
    name: str,
    params: dict[str, Any] | None = None,
    *,
    properties: Iterable[str] | None = None,
    workdir: str | Path | None = None,
    on_result: Callable[[PropertyResult], None] | None = None,
) -> CheckReport:
    """Check compressor ``name`` built with ``params`` (:data:`COMPRESSOR_PROPERTIES`):

    ``params``
        its ``Params`` is a pydantic model whose fields all have a default and a
        description;
    ``roundtrip``
        ``decode(encode(x, seed))`` is ``x.size`` float32 values within
        ``error_bound(x)`` (in its ``error_norm``), for vectors of odd sizes, constants,
        zeros, outliers, tiny and large magnitudes, and three seeds;
    ``bytes``
        ``encode`` returns ``bytes`` of ``encoded_nbytes(n)`` (when stated), a fresh
        instance decodes them alike (nothing but the payload is read), and a tiny FedAvg
        run with it charges each upload the payload's length;
    ``determinism``
        the same seed gives the same payload, and the tiny run twice the same records;
    ``resume``
        the tiny run stopped after round 2 and resumed gives the uninterrupted run's
        records (an error-feedback residual is restored from the checkpoint).

    Raises :class:`~mecsim.registry.UnknownName` / :class:`~mecsim.registry.PluginError`
    for a name that does not resolve, :class:`~mecsim.scenario.ScenarioError` for
    ``params`` its Params refuses."""
    wanted = list(COMPRESSOR_PROPERTIES if properties is None else properties)
    unknown = [p for p in wanted if p not in COMPRESSOR_PROPERTIES]
    if unknown:
        raise ValueError(f"unknown properties {unknown}; known: {', '.join(COMPRESSOR_PROPERTIES)}")
    COMPRESSORS.get(name)
    data = _merge(TINY, {"compressor": {"name": name, "params": dict(params or {})}})
    scenario_from_dict(data, f"mecsim check {name}")  # ScenarioError: bad params, no run
    start = time.perf_counter()
    results: list[PropertyResult] = []
    with tempfile.TemporaryDirectory(prefix="mecsim-check-") as tmp:
        folder = Path(workdir) if workdir is not None else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        kit = _CompressorKit(name, dict(params or {}), folder)
        for prop in COMPRESSOR_PROPERTIES:
            t0 = time.perf_counter()
            if prop not in wanted:
                result = PropertyResult(prop, True, "not asked for", skipped=True)
            else:
                try:
                    result = PropertyResult(prop, True, getattr(kit, f"check_{prop}")())
                except _Fail as exc:
                    result = PropertyResult(prop, False, exc.reason, exc.first_difference)
                except Exception as exc:  # the compressor's own code raised
                    result = PropertyResult(prop, False, _one_line(exc))
            result.seconds = round(time.perf_counter() - t0, 3)
            results.append(result)
            if on_result is not None:
                on_result(result)
    return CheckReport(name, results, time.perf_counter() - start, data)


# --------------------------------------------------------------------------- async servers

#: The properties of an asynchronous server (:func:`check_async_server`), in the order
#: checked.
ASYNC_SERVER_PROPERTIES: tuple[str, ...] = (
    "params",
    "versions",
    "weights",
    "determinism",
    "resume",
)

#: The kit's tiny asynchronous scenario (as tests/support/scenarios.py's): 4 clients (two
#: Pi 3B, a Pi 4, the default device) in one shared cell, 400 embedded MNIST samples, 6
#: server versions evaluated every 3, a checkpoint after every version.
TINY_ASYNC: dict[str, Any] = {
    "name": "check-async",
    "seed": 3,
    "rounds": 6,
    "dataset": {
        "name": "mnist-embedded",
        "train_size": 400,
        "test_size": 200,
        "partition": {"method": "iid"},
    },
    "model": {"name": "mlp_2nn"},
    "topology": {"clients": 4},
    "devices": {"clients": [{"profile": "rpi3b", "count": 2}, {"profile": "rpi4"}]},
    "channel": {
        "model": "fixed_rate",
        "uplink": {"rate_bps": 20e6, "shared": True},
        "downlink": {"rate_bps": 50e6, "shared": True},
    },
    "training": {"epochs": 1, "batch_size": 20, "lr": 0.05},
    "evaluation": {"every": 3},
    "metrics": {"enabled": False},
    "execution": {"backend": "local", "hosts": 1, "call_timeout_s": CHECK_CALL_TIMEOUT_S},
}

#: The settings of each asynchronous mode in the kit's runs (small enough that 4 clients
#: make 6 versions quickly).
_ASYNC_MODE_SETTINGS: dict[str, dict[str, Any]] = {
    "async": {"alpha": 0.5},
    "buffered": {"buffer_size": 2},
    "semi_sync": {"period_s": 2.0},
}

#: An asynchronous server's run files (updates.csv in place of clients.csv).
ASYNC_RECORD_FILES = ("rounds.csv", "updates.csv", "optraces.jsonl")

#: The name the kit registers its watching subclass of the server under, for its runs.
_PROBE_NAME = "mecsim-check-async-server"

#: Updates in a row that make no version before the kit calls a server stuck (the tiny
#: run has 4 clients: FedBuff's buffer there is 2).
_STALL_UPDATES = 50


class _ProbeStop(Exception):
    """The server broke its contract in a kit run: the run stops here (a server that does
    not count its versions would run for ever)."""


class _ServerProbe:
    """What the kit saw of a server's calls in its runs, by property."""

    def __init__(self) -> None:
        self.problems: dict[str, list[str]] = {"versions": [], "weights": []}
        self.calls = 0
        self.versions = 0
        self.since = 0  # updates since the last version

    def _stop(self, prop: str, message: str) -> None:
        self.problems[prop].append(message)
        raise _ProbeStop(f"{prop}: {message}")

    def after(self, server: Any, method: str, made: Any, before: int, shape: Any) -> None:
        self.calls += method == "on_update"
        if not isinstance(made, bool | np.bool_):
            self._stop("versions", f"{method} returned {made!r}, not a bool")
        after = server.version
        if after != before + int(made):
            self._stop(
                "versions",
                f"{method} returned {bool(made)} and the version went from {before} to "
                f"{after} (True: one more; False: unchanged)",
            )
        w = server.weights
        if not isinstance(w, np.ndarray) or w.shape != shape or w.dtype != np.float32:
            got = f"{type(w).__name__} {getattr(w, 'shape', '')} {getattr(w, 'dtype', '')}"
            self._stop(
                "weights",
                f"after {method} the weights are {got.strip()}, not float32 of shape {shape}",
            )
        if not np.isfinite(w).all():
            self._stop(
                "weights",
                f"after {method} (version {after}) the weights hold NaN or inf (every update "
                "the run gave it was finite)",
            )
        if made:
            self.versions += 1
            self.since = 0
        elif method == "on_update":
            self.since += 1
            if self.since >= _STALL_UPDATES:
                self._stop(
                    "versions",
                    f"{_STALL_UPDATES} updates in a row made no version (4 clients in the "
                    "kit's run): it would never reach the scenario's rounds",
                )


def _probe_class(cls: Any, probe: _ServerProbe) -> type:
    """A subclass of ``cls`` whose on_update (and flush) report to ``probe``."""

    def on_update(self: Any, update: Any, staleness: int) -> Any:
        before, shape = self.version, np.shape(self.weights)
        made = cls.on_update(self, update, staleness)
        probe.after(self, "on_update", made, before, shape)
        return made

    body: dict[str, Any] = {"on_update": on_update, "__module__": cls.__module__}
    if callable(getattr(cls, "flush", None)):

        def flush(self: Any) -> Any:
            before, shape = self.version, np.shape(self.weights)
            made = cls.flush(self)
            probe.after(self, "flush", made, before, shape)
            return made

        body["flush"] = flush
    return type(cls.__name__, (cls,), body)


def _async_mode(name: str, cls: type, mode: str | None) -> str:
    """The mode the kit runs server ``name`` in: ``mode``, else a built-in's own, else
    semi_sync for a server with flush(), else async."""
    if mode is not None:
        if mode not in _ASYNC_MODE_SETTINGS:
            raise ValueError(
                f"mode {mode!r} is not an asynchronous mode; one of "
                f"{', '.join(_ASYNC_MODE_SETTINGS)}"
            )
        return mode
    own = {server: m for m, server in MODE_SERVERS.items()}
    if name in own:
        return own[name]
    return "semi_sync" if callable(getattr(cls, "flush", None)) else "async"


def _async_data(server: str, params: dict[str, Any], mode: str) -> dict[str, Any]:
    aggregation = {"mode": mode, **_ASYNC_MODE_SETTINGS[mode]}
    aggregation["server"] = {"name": server, "params": dict(params)}
    return _merge(TINY_ASYNC, {"aggregation": aggregation})


class _AsyncServerKit:
    def __init__(self, name: str, params: dict[str, Any], mode: str, folder: Path) -> None:
        self.name, self.params, self.mode, self.folder = name, dict(params), mode, folder
        self.cls = ASYNC_SERVERS.get(name)
        self.probe = _ServerProbe()
        self.data = _async_data(_PROBE_NAME, self.params, mode)
        self._base: Path | None = None
        self._base_error: _Fail | None = None

    def _run(self, label: str, **kwargs: Any) -> Path:
        out = self.folder / label
        sc = scenario_from_dict(self.data, f"mecsim check {self.name}")
        try:
            outcome = run_in_folder(sc, out, backend="local", hosts=1, **kwargs)
        except SimulatedKill:
            raise
        except _ProbeStop as exc:
            raise _Fail(f"the {label} run stopped where the server broke {exc}") from None
        except Exception as exc:
            raise _Fail(f"the {label} run (mode {self.mode}) failed: {_one_line(exc)}") from None
        if outcome.status != "finished":
            raise _Fail(f"the {label} run ended {outcome.status}")
        return out

    def base(self) -> Path:
        if self._base is None and self._base_error is None:
            try:
                self._base = self._run("base")
            except _Fail as exc:
                self._base_error = exc
        if self._base_error is not None:
            raise self._base_error
        assert self._base is not None
        return self._base

    def _verdict(self, prop: str) -> None:
        try:
            self.base()
        except _Fail:
            if self.probe.problems[prop]:
                raise _Fail(self.probe.problems[prop][0]) from None
            other = [p for p, found in self.probe.problems.items() if found]
            if other:  # the run stopped at another property's failure
                raise _Skip(
                    f"not checked to the end: the run stopped at the {other[0]} failure "
                    f"({self.probe.calls} on_update calls held)"
                ) from None
            raise
        if self.probe.problems[prop]:
            raise _Fail(self.probe.problems[prop][0])

    def check_params(self) -> str:
        params = getattr(self.cls, "Params", None)
        if not (isinstance(params, type) and issubclass(params, BaseModel)):
            raise _Fail("its Params is not a pydantic model")
        problems = [
            f"{field}: " + ("no default" if info.is_required() else "no description")
            for field, info in params.model_fields.items()
            if info.is_required() or not info.description
        ]
        if problems:
            raise _Fail("Params fields without " + "; ".join(problems))
        params(**self.params)
        return f"{len(params.model_fields)} documented fields, built with {self.params or '{}'}"

    def check_versions(self) -> str:
        self._verdict("versions")
        p = self.probe
        return (
            f"{p.calls} on_update calls in a run of mode {self.mode}, {p.versions} versions: "
            "each True one more version, each False none"
        )

    def check_weights(self) -> str:
        self._verdict("weights")
        size = int(json.loads((self.base() / "run.json").read_text())["num_params"])
        return f"after every call {size} finite float32 values"

    def check_determinism(self) -> str:
        other = self._run("again")
        diff = first_difference(self.base(), other, ASYNC_RECORD_FILES)
        if diff:
            raise _Fail(
                "the same seed twice: the records differ (randomness not from the scenario?)",
                diff,
            )
        return "the same seed twice: identical records"

    def check_resume(self) -> str:
        base = self.base()
        out = self.folder / "resumed"
        try:
            self._run("resumed", observers=[StopAfter(2)])
        except SimulatedKill:
            pass
        target = prepare_resume(out)
        try:
            run_in_folder(None, resume=target, hosts=1, backend="local")
        except Exception as exc:
            raise _Fail(f"the resumed run failed: {_one_line(exc)}") from None
        finally:
            target.lock.release()
        diff = first_difference(base, out, ASYNC_RECORD_FILES)
        if diff:
            raise _Fail(
                f"stopped after version 3 and resumed from version {target.rounds_done}: the "
                "records differ from the uninterrupted run's (state outside the server's "
                "attributes, or versions that depend on the weights' values?)",
                diff,
            )
        done = target.rounds_done
        return f"stopped after version 3, resumed from version {done}: identical records"


def check_async_server(
    name: str,
    params: dict[str, Any] | None = None,
    *,
    mode: str | None = None,
    properties: Iterable[str] | None = None,
    workdir: str | Path | None = None,
    on_result: Callable[[PropertyResult], None] | None = None,
) -> CheckReport:
    """Check asynchronous server ``name`` (an ``mecsim.async_servers`` name or
    ``module:Class``) built with ``params`` in real runs of :data:`TINY_ASYNC` in ``mode``
    (default: a built-in's own mode; semi_sync for a server with ``flush()``, else async)
    (:data:`ASYNC_SERVER_PROPERTIES`):

    ``params``
        its ``Params`` is a pydantic model whose fields all have a default and a
        description;
    ``versions``
        ``on_update`` (and ``flush``) return a bool, and ``version`` grows by exactly one
        when it is True and stays when it is False; versions keep coming (not 50 updates
        in a row without one);
    ``weights``
        after every call the weights are finite float32 of the model's shape;
    ``determinism``
        the same seed twice gives identical records;
    ``resume``
        the run stopped after version 3 and resumed from its checkpoint gives the
        uninterrupted run's records (the server's state is its attributes, and when it
        makes a version does not depend on the weights' values: docs/async.md).

    Raises :class:`~mecsim.registry.UnknownName` / :class:`~mecsim.registry.PluginError`
    for a name that does not resolve, :class:`~mecsim.scenario.ScenarioError` for
    ``params`` its Params refuses (or a server the mode cannot run)."""
    wanted = list(ASYNC_SERVER_PROPERTIES if properties is None else properties)
    unknown = [p for p in wanted if p not in ASYNC_SERVER_PROPERTIES]
    if unknown:
        raise ValueError(
            f"unknown properties {unknown}; known: {', '.join(ASYNC_SERVER_PROPERTIES)}"
        )
    cls = ASYNC_SERVERS.get(name)
    run_mode = _async_mode(name, cls, mode)
    data = _async_data(name, dict(params or {}), run_mode)
    scenario_from_dict(data, f"mecsim check {name}")  # ScenarioError: bad params, no run
    start = time.perf_counter()
    results: list[PropertyResult] = []
    with tempfile.TemporaryDirectory(prefix="mecsim-check-") as tmp:
        folder = Path(workdir) if workdir is not None else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        kit = _AsyncServerKit(name, dict(params or {}), run_mode, folder)
        ASYNC_SERVERS.unregister(_PROBE_NAME)
        register("async_server", _PROBE_NAME, _probe_class(cls, kit.probe))
        try:
            for prop in ASYNC_SERVER_PROPERTIES:
                t0 = time.perf_counter()
                if prop not in wanted:
                    result = PropertyResult(prop, True, "not asked for", skipped=True)
                else:
                    try:
                        result = PropertyResult(prop, True, getattr(kit, f"check_{prop}")())
                    except _Fail as exc:
                        result = PropertyResult(prop, False, exc.reason, exc.first_difference)
                    except _Skip as exc:
                        result = PropertyResult(prop, True, str(exc), skipped=True)
                    except Exception as exc:  # the server's own code raised
                        result = PropertyResult(prop, False, _one_line(exc))
                result.seconds = round(time.perf_counter() - t0, 3)
                results.append(result)
                if on_result is not None:
                    on_result(result)
        finally:
            ASYNC_SERVERS.unregister(_PROBE_NAME)
    return CheckReport(name, results, time.perf_counter() - start, data)


__all__ = [
    "ASYNC_RECORD_FILES",
    "ASYNC_SERVER_PROPERTIES",
    "BUILTIN_OVERRIDES",
    "COMPRESSOR_PROPERTIES",
    "CHANGED_SINCE_0_1",
    "FLOAT_RTOL",
    "FLOPS_RTOL",
    "LEARNING_RTOL",
    "PROPERTIES",
    "RECORD_FILES",
    "TINY",
    "TINY_ASYNC",
    "CheckReport",
    "PropertyResult",
    "SimulatedKill",
    "StopAfter",
    "assert_records_close",
    "assert_same_records",
    "check_algorithm",
    "check_async_server",
    "check_compressor",
    "check_scenario_data",
    "compared_columns",
    "first_difference",
    "is_host_column",
    "learning_column",
    "resume_run",
]
