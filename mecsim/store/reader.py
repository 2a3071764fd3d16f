"""Reading a run's records back exactly as they were written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

# Floats must be read back exactly as written (repr). pandas < 3's default parser can be
# 1 ulp off, so ask for round_trip there; pandas >= 3 is exact and deprecates the option.
_EXACT_FLOATS = {"float_precision": "round_trip"} if int(pd.__version__.split(".")[0]) < 3 else {}


def read_csv_exact(path: str | Path) -> pd.DataFrame:
    """A records CSV with every float exactly as written."""
    return pd.read_csv(path, **_EXACT_FLOATS)


def rows_from_csv(path: Path) -> list[dict[str, Any]]:
    """Round rows of ``rounds.csv`` read back as a run produced them (numbers exact)."""
    if not path.exists() or path.stat().st_size == 0:
        return []
    rows: list[dict[str, Any]] = read_csv_exact(path).to_dict("records")
    return rows


def read_rounds(run_dir: str | Path) -> pd.DataFrame:
    return pd.read_csv(Path(run_dir) / "rounds.csv")


def read_clients(run_dir: str | Path) -> pd.DataFrame:
    return pd.read_csv(Path(run_dir) / "clients.csv")
