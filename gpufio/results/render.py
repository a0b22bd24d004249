"""The one renderer: rows (dicts with the same keys) and a title into a Rich table,
Markdown, CSV (quoted) or JSON. Every table gpufio prints comes through here: the run's
summary, compare, the GNN stage table, engines, info and the live progress tables."""

from __future__ import annotations

import csv
import io
import json
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:  # Rich loads when a table is drawn: a run's JSON or CSV starts without it
    from rich.console import Console
    from rich.table import Table

FORMATS = ("table", "markdown", "csv", "json")


def _text(value: Any) -> str:
    return ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def table(rows: list[dict[str, Any]], title: str = "", left: Iterable[str] = (),
          columns: Iterable[str] = (), show_header: bool = True) -> Table:
    """A Rich table of ``rows``: the ``left`` columns left-aligned (names), the rest right.
    Cells and title are text, never Rich markup (a path or a key may hold brackets)."""
    from rich.table import Table
    from rich.text import Text

    left = set(left)
    keys = list(rows[0]) if rows else list(columns)
    t = Table(title=Text(title) if title else None, show_header=show_header, expand=False)
    for key in keys:
        t.add_column(Text(key), justify="left" if key in left else "right")
    for row in rows:
        t.add_row(*[Text(_text(row.get(k, ""))) for k in keys])
    return t


def _widest_word(text: str) -> int:
    return max((len(w) for w in text.split()), default=0)


def fitted(rows: list[dict[str, Any]], title: str, left: Iterable[str], columns: Iterable[str],
           width: int) -> list[Table]:
    """``rows`` as tables no wider than ``width`` that cut no header and no word of a cell:
    one table where it fits; else the columns dealt over several, each repeating the first
    (the job), so a narrow terminal shows every header whole instead of 'aggregat…'."""
    left = tuple(left)
    keys = list(rows[0]) if rows else list(columns)
    # a column needs its widest word, one space each side and its border
    need = {k: max([_widest_word(k)] + [_widest_word(_text(r.get(k, ""))) for r in rows]) + 3
            for k in keys}
    if not keys or sum(need.values()) + 1 <= width:
        return [table(rows, title, left, columns)]
    first, groups = keys[0], [[keys[0]]]
    for k in keys[1:]:
        if sum(need[c] for c in groups[-1]) + need[k] + 1 > width and len(groups[-1]) > 1:
            groups.append([first])
        groups[-1].append(k)
    return [table([{k: r.get(k, "") for k in group} for r in rows], title if i == 0 else "",
                  left, group)
            for i, group in enumerate(groups)]


def render(rows: list[dict[str, Any]], fmt: str, *, title: str = "",
           left: Iterable[str] = (), columns: Iterable[str] = (),
           console: Console | None = None, problems: Iterable[str] = (),
           heading: Iterable[str] = ()) -> str:
    """``rows`` in ``fmt``; 'table' prints to ``console`` (stdout by default) and returns ''.
    ``columns`` names the header when there are no rows; a table or Markdown is preceded
    by the ``heading`` lines (what each job was, as fio heads its output) and a table is
    followed by the ``problems`` (what makes its numbers untrustworthy), in red, under
    what they are about."""
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
        head += "".join(f"- {line}\n" for line in heading) + ("\n" if heading else "")
        from tabulate import tabulate  # only Markdown needs it: a run starts without it

        return head + tabulate(rows, headers="keys", tablefmt="github") + "\n"
    if fmt != "table":
        raise ValueError(f"unknown format {fmt!r}")
    from rich.console import Console
    from rich.text import Text

    console = console or Console()
    for line in heading:
        console.print(Text(line))
    for part in fitted(rows, title, left, columns, console.width):
        console.print(part)
    for line in problems:
        console.print(Text(line, style="red"))
    return ""
