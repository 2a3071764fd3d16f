"""Comparing records written on another machine (golden records, old run folders).

The last bits of floating-point results depend on the CPU: numpy and PyTorch pick their
kernels by instruction set (AVX-512 or AVX2), and a kernel's order of summation with it.
So against records written elsewhere, counts, ids, statuses, bytes and op-traces must be
equal exactly; emulated times, energies and channel draws (floats) within a relative
:data:`FLOAT_RTOL`; and what follows the trained weights (losses, accuracies), which a
few rounds turn a last-bit difference into a visibly different number, to
:data:`LEARNING_RTOL` in round 0 and only present (or NaN) where expected afterwards.
Comparisons on one machine (a backend against the other, a resumed run against an
uninterrupted one, before and after a refactor) stay exact: ``test_resume.
assert_same_records``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from test_resume import is_host_column

from mecsim.store.reader import read_csv_exact

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
    """``got``'s rounds.csv, clients.csv and optraces.jsonl agree with ``expected``'s as
    the module docstring says (host-measured columns and run ids not compared).
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
        for col in x.columns:
            if is_host_column(col) or col == "run_id":
                continue
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
