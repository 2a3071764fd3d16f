"""What a person sees in the terminal at the end of a run: the summary tables.

A value is never cut short or wrapped: a terminal too narrow for a table's columns gets
the table in several parts, each repeating the ``method`` column with as many of the
others as fit (a header may wrap at its spaces, a value never).
"""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from mecsim.store.summary import summarise, table_rows, table_titles

#: What a column takes beside its text in a rich table with the default box: a space of
#: padding on each side and a border (and the table one more border).
_COLUMN_EXTRA = 3


def _min_width(header: str, cells: list[str]) -> int:
    """The narrowest a column's text can be: its longest value, or its header's longest
    word (a header may wrap at its spaces; a value never)."""
    return max([*(len(w) for w in header.split()), *(len(c) for c in cells), 1])


def fitting_tables(
    title: str, header: list[str], rows: list[list[str]], width: int | None
) -> list[Table]:
    """``rows`` under ``header`` (the first column, the row's name, repeated in every part)
    as one table, or as several when ``width`` (the terminal's) cannot hold every column;
    no cell is ever cut or wrapped."""
    least = [_min_width(h, [r[j] for r in rows]) for j, h in enumerate(header)]
    parts: list[list[int]] = [[]]
    used = 1 + least[0] + _COLUMN_EXTRA
    for j in range(1, len(header)):
        need = least[j] + _COLUMN_EXTRA
        if width is not None and parts[-1] and used + need > width:
            parts.append([])
            used = 1 + least[0] + _COLUMN_EXTRA
        parts[-1].append(j)
        used += need
    tables = []
    for k, cols in enumerate(parts):
        widths = {j: least[j] for j in [0, *cols]}
        # room left: headers unwrapped where it allows, first come first served
        spare = (
            None if width is None else width - 1 - sum(w + _COLUMN_EXTRA for w in widths.values())
        )
        for j in widths:
            grow = len(header[j]) - widths[j]
            if grow > 0 and (spare is None or grow <= spare):
                widths[j] += grow
                spare = None if spare is None else spare - grow
        suffix = f" ({k + 1} of {len(parts)})" if len(parts) > 1 else ""
        table = Table(title=title + suffix)
        table.add_column(header[0], width=widths[0], no_wrap=True)
        for j in cols:
            table.add_column(header[j], justify="right", width=widths[j])
        for r in rows:  # a method's name may be a plugin's: printed literally
            table.add_row(escape(r[0]), *(escape(r[j]) for j in cols))
        tables.append(table)
    return tables


def summary_table(
    algorithm: str, rows: list[dict[str, Any]], width: int | None = None
) -> list[Table]:
    """The two tables ``mecsim run`` prints at the end (the KAPC papers' Tables 5 and 6),
    fitted to a terminal ``width`` columns wide (None: one table each)."""
    s = summarise(rows)
    th, tc, ch, cc = table_rows(s)
    time_title, cost_title = table_titles(s)
    return [
        *fitting_tables(time_title, ["method", *th], [[algorithm, *tc]], width),
        *fitting_tables(cost_title, ["method", *ch], [[algorithm, *cc]], width),
    ]


def list_table(
    title: str,
    header: list[str],
    rows: list[list[str]],
    width: int | None,
    keep: int = 1,
    right: frozenset[int] = frozenset(),
) -> Table:
    """A list (one line per item, e.g. ``mecsim runs``) fitted to ``width``: the first
    ``keep`` columns (the item's id) always whole, the others dropped from the right until
    what is left fits; no value is ever cut or wrapped. Columns in ``right`` (numbers)
    are right-aligned."""
    least = [_min_width(h, [r[j] for r in rows]) for j, h in enumerate(header)]
    cols = list(range(len(header)))
    while (
        width is not None
        and len(cols) > keep
        and 1 + sum(least[j] + _COLUMN_EXTRA for j in cols) > width
    ):
        cols.pop()
    dropped = len(header) - len(cols)
    table = Table(
        title=title + (f" ({dropped} of its columns need a wider terminal)" if dropped else "")
    )
    for j in cols:
        table.add_column(
            header[j], no_wrap=True, min_width=least[j], justify="right" if j in right else "left"
        )
    for r in rows:  # ids, names: printed literally
        table.add_row(*(escape(r[j]) for j in cols))
    return table
