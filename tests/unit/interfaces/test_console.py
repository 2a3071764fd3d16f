"""Tables a person copies from never cut a value: the end-of-run tables come in parts on a
narrow terminal, and ``mecsim runs`` drops columns, never a run id."""

from __future__ import annotations

import pytest
from rich.console import Console

from mecsim.interfaces.console import fitting_tables, list_table

HEADER = [
    "method",
    "U-Comm (MiB)",
    "D-Comm (MiB)",
    "C-Comp (GFLOPs)",
    "S-Comp (GFLOPs)",
    "Client energy (J)",
    "Server mem (MiB)",
    "Best mean acc (%)",
]
ROW = ["kapc_bls", "7.63", "7.63", "7.14", "0.004", "729.0", "381.3", "94.79"]
IDS = ["phsfl-mnist-4x25-20261125-213344-8f3a9c1d", "fedavg-mnist-10-20261125-213344-aa"]


def _render(tables, width: int) -> str:
    console = Console(width=width, record=True, force_terminal=False)
    for t in tables:
        console.print(t)
    return console.export_text()


@pytest.mark.parametrize("width", [40, 60, 80, 120, 200])
def test_end_of_run_tables_fit_and_cut_nothing(width: int) -> None:
    text = _render(
        fitting_tables("Communication and computation per round", HEADER, [ROW], width), width
    )
    assert max(len(line) for line in text.splitlines()) <= width
    assert "…" not in text
    for value in ROW:
        assert value in text  # every value whole, and every header word
    for word in {w for h in HEADER for w in h.split()}:
        assert word in text
    # one table when every column fits at its narrowest (a value, or a header's longest
    # word, + 3 for padding and border; + 1 for the table's edge), else parts
    narrowest = 1 + sum(
        max(len(v), *(len(w) for w in h.split())) + 3 for h, v in zip(HEADER, ROW, strict=True)
    )
    assert (text.count("kapc_bls") == 1) == (width >= narrowest)


@pytest.mark.parametrize("width", [50, 80, 160])
def test_run_lists_keep_ids_whole_and_drop_columns_instead(width: int) -> None:
    header = ["id", "status", "rounds", "algorithm", "best acc", "emulated (s)", "submitted"]
    rows = [
        [IDS[0], "running", "3/12", "phsfl", "91.20 %", "123.4", "2026-11-25 21:33:44"],
        [IDS[1], "finished", "30/30", "fedavg", "94.79 %", "734.1", "2026-11-25 21:30:00"],
    ]
    text = _render([list_table("runs", header, rows, width, right=frozenset({2}))], width)
    assert all(run_id in text for run_id in IDS) and "…" not in text
    assert max(len(line) for line in text.splitlines()) <= width
    shown = [h for h in header if h in text]
    assert shown == header[: len(shown)] and shown[0] == "id"
    assert (len(shown) == len(header)) == (width >= 160)
    assert ("need a wider terminal" in text) == (len(shown) < len(header))
