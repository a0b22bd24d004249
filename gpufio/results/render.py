"""The one renderer: rows (dicts with the same keys) and a title into a Rich table,
Markdown, CSV (quoted) or JSON. Every table gpufio prints comes through here: the run's
summary, compare, the GNN stage table, engines, info and the live progress tables."""

from __future__ import annotations

import csv
import io
import json
from typing import Any, Iterable

from rich.console import Console
from rich.table import Table
from rich.text import Text

FORMATS = ("table", "markdown", "csv", "json")


def _text(value: Any) -> str:
    return ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def table(rows: list[dict[str, Any]], title: str = "", left: Iterable[str] = (),
          columns: Iterable[str] = (), show_header: bool = True) -> Table:
    """A Rich table of ``rows``: the ``left`` columns left-aligned (names), the rest right.
    Cells and title are text, never Rich markup (a path or a key may hold brackets)."""
    left = set(left)
    keys = list(rows[0]) if rows else list(columns)
    t = Table(title=Text(title) if title else None, show_header=show_header, expand=False)
    for key in keys:
        t.add_column(Text(key), justify="left" if key in left else "right")
    for row in rows:
        t.add_row(*[Text(_text(row.get(k, ""))) for k in keys])
    return t


def render(rows: list[dict[str, Any]], fmt: str, *, title: str = "",
           left: Iterable[str] = (), columns: Iterable[str] = (),
           console: Console | None = None, problems: Iterable[str] = ()) -> str:
    """``rows`` in ``fmt``; 'table' prints to ``console`` (stdout by default) and returns ''.
    ``columns`` names the header when there are no rows; a table is followed by the
    ``problems`` (what makes its numbers untrustworthy), in red, under what they are about."""
    if fmt == "json":
        return json.dumps(rows, indent=2) + "\n"
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=list(rows[0]) if rows else list(columns))
        writer.writeheader()
        writer.writerows(rows)
        return out.getvalue()
    if fmt == "markdown":
        head = f"{title}\n\n" if title else ""
        from tabulate import tabulate  # only Markdown needs it: a run starts without it

        return head + tabulate(rows, headers="keys", tablefmt="github") + "\n"
    if fmt != "table":
        raise ValueError(f"unknown format {fmt!r}")
    console = console or Console()
    console.print(table(rows, title, left, columns))
    for line in problems:
        console.print(Text(line, style="red"))
    return ""
