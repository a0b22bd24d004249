"""The block workload's run of a profile: once, or repeated (each job's median run), or
each MPI rank's share with the ranks' documents merged on rank 0; and a job's targets."""

from __future__ import annotations

from typing import Any

from gpufio.core.errors import BadInput, RunFailed
from gpufio.core.job import Job, Profile
from gpufio.results.repeat import combine
from gpufio.run import opening
from gpufio.workloads.block import world
from gpufio.workloads.block import document, runner
from gpufio.workloads.block.live import LiveDisplay
from gpufio.workloads.block.merge import merge_ranks


def _once(prof: Profile, quiet: bool, gate: Any = None, note: str = "") -> dict[str, Any]:
    """One run of the profile; ``note`` says on the live table what the run is where the
    result will not be its numbers alone."""
    if quiet:
        return document.build_document(runner.run_profile(prof, quiet=True, gate=gate), prof)
    with LiveDisplay(note=note) as live:
        return document.build_document(
            runner.run_profile(prof, on_tick=live.update, gate=gate), prof)


def _repeat_note(run: int, repeat: int) -> str:
    return f"run {run + 1} of {repeat}; the result reports each job's median run" \
        if repeat > 1 else ""


def _rank_once(w: world.World, prof: Profile, quiet: bool,
               note: str = "") -> list[dict[str, Any]] | None:
    """This rank's run of its share, gathered: every rank's document on rank 0, None on the
    others. A rank that cannot go on tells rank 0, which names it and ends the job."""
    try:
        try:
            share = f"rank 0's share of {w.size}; the result merges every rank's"
            doc = _once(w.profile_for(prof), quiet or not w.root, gate=w.gate,
                        note="; ".join(filter(None, [share if w.size > 1 else "", note])))
        except world.RankAbort:
            raise
        except Exception as e:  # this rank cannot go on: the others must hear of it
            why = str(e) if isinstance(e, BadInput) else f"{type(e).__name__}: {e}"
            if w.root:
                w.abort(f"rank 0 ({w.host}): {why}")
            if not w.fail(why):  # rank 0 is gone: this rank is the one to say so
                raise RunFailed(f"rank {w.rank} ({w.host}): {why}") from None
            raise SystemExit(1) from None
        doc["rank"] = w.facts()
        return w.gather(doc)
    except world.RankAbort as e:
        if w.root:
            raise RunFailed(str(e)) from None
        if not e.reported:  # rank 0 is gone: this rank is the one to say so
            raise RunFailed(f"rank {w.rank} ({w.host}): {e}") from None
        raise SystemExit(1) from None


def _distributed(w: world.World, prof: Profile, quiet: bool, repeat: int) -> dict[str, Any]:
    """Every rank runs its share of the profile ``repeat`` times, each job's clock starting
    at the same gate; rank 0 returns the merged document (with --repeat, each job's median
    run), the other ranks exit with the run's code."""
    merged = []
    for i in range(repeat):  # every repeat on every rank: none may stop alone
        docs = _rank_once(w, prof, quiet, _repeat_note(i, repeat))
        if docs is not None:
            merged.append(merge_ranks(docs))
    if not w.root:
        try:
            code = w.released()
        except world.RankAbort as e:  # rank 0 is gone: this rank is the one to say so
            raise RunFailed(f"rank {w.rank} ({w.host}): {e}") from None
        raise SystemExit(code)
    doc = merged[0] if len(merged) == 1 else combine(merged)
    w.release(int(doc["interrupted"] or any(j["error"] for j in doc["jobs"])))
    return doc


def run(prof: Profile, quiet: bool, repeat: int) -> dict[str, Any]:
    """Run the profile ``repeat`` times (stopping at an interrupted run): one document, with
    each job's median run and the spread when repeated. Under an MPI launcher, every rank
    runs its share and rank 0 reports them merged."""
    w = world.detect()
    if w is not None:
        return _distributed(w, prof, quiet, repeat)
    docs = []
    for i in range(repeat):
        docs.append(_once(prof, quiet, note=_repeat_note(i, repeat)))
        if docs[-1]["interrupted"]:
            break
    return docs[0] if len(docs) == 1 else combine(docs)


def targets(job: Job, lay_out: bool) -> list[str]:
    """The job's targets; laid out: missing files created with gpufio's pattern."""
    return opening.job_targets(job, quiet=False) if lay_out else opening.job_target_paths(job)[0]
