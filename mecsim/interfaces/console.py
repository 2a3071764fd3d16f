"""What a person sees in the terminal at the end of a run: the summary tables."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from mecsim.analysis.summary import summarise, table_rows


def summary_table(algorithm: str, rows: list[dict[str, Any]]) -> list[Table]:
    s = summarise(rows)
    th, tc, ch, cc = table_rows(s)
    time_table = Table(title="Average time per round (emulated, critical path)")
    cost_table = Table(title="Communication and computation per round")
    for table, header, cells in ((time_table, th, tc), (cost_table, ch, cc)):
        table.add_column("method")
        for h in header:
            table.add_column(h, justify="right")
        table.add_row(algorithm, *cells)
    return [time_table, cost_table]
