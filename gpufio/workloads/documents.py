"""What the workloads' own result documents share: the document rendered whole as JSON or as
its table (with the problem lines under a terminal table), those problem lines, and the
targets whose reads did not reach storage."""

from __future__ import annotations

import json
from typing import Any, Callable, Sequence

from gpufio.results.load import not_storage
from gpufio.results.render import render as render_rows


def problem_lines(doc: dict[str, Any],
                  bad_data: Callable[[dict[str, Any]], str | None]) -> list[str]:
    """A line per job that failed (its failure text) or whose data did not check out
    (``bad_data(job)``: what differed, or None)."""
    out = []
    for job in doc["jobs"]:
        why = job.get("failure") or bad_data(job)
        if why:
            out.append(f"{job['jobname']}: {why}")
    return out


def render_document(doc: dict[str, Any], fmt: str, console: Any, *, title: str,
                    rows: list[dict[str, Any]], left: Sequence[str],
                    problems: list[str]) -> str:
    """``doc`` in ``fmt``: the whole document as JSON, else its ``rows`` as the one table
    renderer draws them (a 'table' prints to ``console`` and returns '')."""
    if fmt == "json":
        return json.dumps(doc, indent=2) + "\n"
    return render_rows(rows, fmt, title=title, left=tuple(left), columns=("job",),
                       console=console, problems=problems if fmt == "table" else ())


def not_storage_title(doc: dict[str, Any]) -> str:
    """What a table's title adds for the targets whose reads did not reach storage
    ('' when every one did): ' · not storage: PATH (KIND), ...'."""
    found = [f"{path} ({s['kind']})" for path, s in not_storage(doc).items()]
    return f" · not storage: {', '.join(found)}" if found else ""
