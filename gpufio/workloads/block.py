"""The block workload: fio's I/O benchmark over the engines (run/), with live progress and
fio-shaped result documents (results/)."""

from __future__ import annotations

from typing import Any, Mapping

from gpufio.core.job import Profile
from gpufio.results import document
from gpufio.results.live import LiveDisplay
from gpufio.results.load import METRICS
from gpufio.results.repeat import combine
from gpufio.run import runner
from gpufio.workloads import Workload, register


def _once(prof: Profile, quiet: bool) -> dict[str, Any]:
    if quiet:
        return document.build_document(runner.run_profile(prof, quiet=True), prof)
    with LiveDisplay() as live:
        return document.build_document(runner.run_profile(prof, on_tick=live.update), prof)


def run(prof: Profile, quiet: bool, repeat: int) -> dict[str, Any]:
    """Run the profile ``repeat`` times (stopping at an interrupted run): one document, with
    each job's median run and the spread when repeated."""
    docs = []
    for _ in range(repeat):
        docs.append(_once(prof, quiet))
        if docs[-1]["interrupted"]:
            break
    return docs[0] if len(docs) == 1 else combine(docs)


def _check(where: str, engine: str, values: Mapping[str, Any]) -> None:
    """The block workload has no keys of its own to check."""


BLOCK = register(Workload(
    name="block", summary="the I/O benchmark", options=(), check=_check,
    formats=document.FORMATS, run=run, render=document.render,
    problems=document.problems, metrics=tuple(METRICS.values())))
