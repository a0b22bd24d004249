"""The gpufio command line: parse, call, render, map failures to exit codes.

Exit codes: 0 success, 1 a run failed (I/O errors, bad data, engine failure), 2 bad input,
3 an internal error (a gpufio bug), 130 interrupted by Ctrl-C or SIGTERM (results so far
are still written).

Each command imports what it needs when it runs: ``gpufio --help`` and a run's start do not
wait for NumPy, Rich's tables or the workloads they do not use.
"""

from __future__ import annotations

import json
import os
import re
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

import typer

from gpufio import __version__
from gpufio.core.errors import BadInput, RunFailed, WorkerHung
from gpufio.core.signals import take_stop_signals
from gpufio.results import DEFAULT_CONFIDENCE

if TYPE_CHECKING:
    from rich.console import Console


# help texts are plain text: Rich markup would eat "[plot]" and "[check]"
app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="fio for the path from storage into GPU memory.")

EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED = 1, 2, 3, 130
DEBUG_ENV = "GPUFIO_DEBUG"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"gpufio {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True,
                                 help="print gpufio's version and exit"),
    debug: bool = typer.Option(False, "--debug",
                               help=f"print the traceback of an internal error (or {DEBUG_ENV}=1)"),
) -> None:
    """fio for the path from storage into GPU memory."""
    if debug:
        os.environ[DEBUG_ENV] = "1"


@contextmanager
def _exit_codes() -> Iterator[None]:
    """One line on stderr and the right exit code for each kind of failure; no traceback
    unless asked for (--debug) for an error gpufio did not foresee."""
    try:
        yield
    except BadInput as e:
        typer.echo(f"gpufio: error: {e}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except WorkerHung as e:
        typer.echo(f"gpufio: error: {e}", err=True)
        sys.stderr.flush()
        os._exit(EXIT_FAILED)  # not sys.exit: the exit handlers would wait for the stuck call
    except RunFailed as e:
        typer.echo(f"gpufio: error: {e}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    except KeyboardInterrupt:
        typer.echo("gpufio: interrupted", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except (typer.Exit, typer.Abort):  # our own exit codes pass through
        raise
    except Exception as e:
        if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            raise
        what = " ".join(f"{type(e).__name__}: {e}".split())
        typer.echo(f"gpufio: internal error: {what} (a gpufio bug; --debug or {DEBUG_ENV}=1 "
                   "prints the traceback)", err=True)
        raise typer.Exit(EXIT_INTERNAL) from None


def _stdout_console() -> Console:
    """A console for the final table; wide when stdout is a file or pipe, not 80 columns."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=200)


def _write(doc: dict, fmt: str, output: Optional[Path],
           render: Callable[[dict, str, Any], str]) -> None:
    """The document in ``fmt`` on stdout or in ``output`` (a table's console writes there;
    the other formats need none, nor Rich)."""
    if output is None:
        sys.stdout.write(render(doc, fmt, _stdout_console() if fmt == "table" else None))
        return
    try:
        with open(output, "w") as f:
            if fmt == "table":
                from rich.console import Console

                f.write(render(doc, fmt, Console(file=f, width=200)))
            else:
                f.write(render(doc, fmt, None))
    except OSError as e:
        raise BadInput(f"--output {output}: {e.strerror}") from None


def _report(doc: dict, fmt: str, output: Optional[Path], workload: Any) -> None:
    """A result as ``_write`` puts it, and its problem lines on stderr where no table on
    stdout shows them."""
    _write(doc, fmt, output, workload.render)
    if fmt != "table" or output is not None:
        for line in workload.problems(doc):
            typer.echo(f"gpufio: {line}", err=True)


def _all_formats() -> list[str]:
    from gpufio.workloads import all_workloads

    return list(dict.fromkeys(f for w in all_workloads().values() for f in w.formats))


YES = typer.Option(False, "--yes", "-y", help="lay out files that take more than 10% of "
                  "their filesystem's free space without asking")


def _layout_consent(yes: bool) -> Any:
    """How a large layout is consented to in this command (core/space): --yes, or a
    question where a user sits at a terminal (not under an MPI launcher: the ranks would
    ask at once); otherwise it is refused."""
    from gpufio.core import space
    from gpufio.core.processes import launched

    interactive = sys.stdin.isatty() and sys.stderr.isatty() and not launched()
    return space.answering(
        (lambda q: typer.confirm(q, default=False, err=True)) if interactive else None, yes)


# fio's --output-format names for gpufio's formats (json+ is fio's json with histograms)
FIO_FORMATS = {"normal": "table", "json+": "fio-json"}


def _format(fmt: str) -> str:
    """--format's value, fio's names (--output-format) read as gpufio's."""
    if fmt == "terse" or "," in fmt:
        raise BadInput(f"--format: {fmt!r}: gpufio writes one format at a time, and not fio's "
                       "terse (fio's normal is table, json+ is fio-json)")
    return FIO_FORMATS.get(fmt, fmt)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    ctx: typer.Context,
    profile_path: Optional[str] = typer.Argument(
        None, metavar="[PROFILE] [--name=JOB --rw=... ...]",
        help="job profile: TOML, or a fio job file ending in .fio; or none, and fio's options "
        "as fio's command line takes them (those before the first --name apply to every job)"),
    fmt: str = typer.Option("table", "--format", "--output-format", "-f",
                            help="table, json, fio-json, csv, markdown (those the profile's "
                            "workload offers); fio's normal and json+ are table and fio-json"),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="write the result here"),
    set_: list[str] = typer.Option([], "--set", "-s", metavar="KEY=VALUE",
                                   help="override a profile key in every job (repeatable; "
                                   "fio's names too: filename=/dev/x, ioengine=io_uring); "
                                   "VALUE is TOML: 'targets=[\"/a\", \"/b\"]', or bare: 4k, /a,/b"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no live display"),
    repeat: int = typer.Option(1, "--repeat", "-r", min=1,
                               help="run N times; report each job's median run and the spread"),
    section: list[str] = typer.Option([], "--section", metavar="JOB",
                                      help="run only this job (repeatable; a swept job's name "
                                      "runs all its sweep points), as fio's --section; gpufio "
                                      "show merges such runs' results"),
    yes: bool = YES,
) -> None:
    """Run a job profile, or a job of fio's options (gpufio run --name=x --rw=randread
    --filename=/dev/nvme0n1), and report IOPS, bandwidth, latency and CPU per job."""
    from gpufio import api, profile
    from gpufio.workloads import DEFAULT_WORKLOAD, all_workloads

    take_stop_signals()
    with _exit_codes(), _layout_consent(yes):
        fmt = _format(fmt)
        # the default workload's formats first: the others load only for a format it lacks
        if fmt not in all_workloads()[DEFAULT_WORKLOAD].formats and fmt not in _all_formats():
            raise BadInput(f"--format: {fmt!r} is not one of {', '.join(_all_formats())}")
        prof = profile.select(_profile(profile_path, ctx.args, profile.parse_set(set_)),
                              section)
        for note in prof.notes:
            typer.echo(f"gpufio: note: {note}", err=True)
        workload = api.workload_of(prof)
        if fmt not in workload.formats:
            raise BadInput(f"--format: {fmt!r} is not one of {', '.join(workload.formats)} "
                           f"for workload '{workload.name}'")
        doc = workload.run(prof, quiet, repeat)
        _report(doc, fmt, output, workload)
        if doc["interrupted"]:
            typer.echo("gpufio: interrupted; results so far were written", err=True)
            raise typer.Exit(EXIT_INTERRUPTED)
        if any(job["error"] for job in doc["jobs"]):
            raise typer.Exit(EXIT_FAILED)


@app.command()
def show(
    files: list[Path] = typer.Argument(..., metavar="RESULT.json...",
                                       help="a result gpufio wrote (gpufio run -f json); "
                                       "several: the runs of one profile's sections as one"),
    fmt: str = typer.Option("table", "--format", "--output-format", "-f",
                            help="table, json, fio-json, csv, markdown (those the result's "
                            "workload offers); fio's normal and json+ are table and fio-json"),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="write it here"),
) -> None:
    """Print a saved result again, as run printed it or in another format."""
    from gpufio import api
    from gpufio.results import load as results

    with _exit_codes():
        fmt = _format(fmt)
        docs = [results.saved(str(f)) for f in files]
        workload = api.workload_of_result(docs[0])
        doc = docs[0] if len(docs) == 1 else results.merged(docs, [str(f) for f in files],
                                                             workload)
        if fmt not in workload.formats:
            raise BadInput(f"--format: {fmt!r} is not one of {', '.join(workload.formats)} "
                           f"for workload '{workload.name}'")
        _report(doc, fmt, output, workload)


def _profile(path: Optional[str], args: list[str], overrides: dict[str, Any]) -> Any:
    """The profile file's jobs, or those of fio's options on the command line (click hands
    the first of them over as the profile when no file comes first)."""
    from gpufio import profile

    if path is not None and path.startswith("-"):
        path, args = None, [path, *args]
    if path is None and not args:
        raise BadInput("run: give a profile (TOML or .fio), or fio's options: "
                       "--name=JOB --rw=randread --filename=... as fio takes them")
    if path is None:
        return profile.load_fio_args(args, overrides)
    if args:
        raise BadInput(f"run: {args[0]}: not an option of gpufio run (fio's options make a "
                       f"job without a profile file, not beside {path})")
    return profile.load(path, overrides)


@app.command()
def compare(
    files: list[Path] = typer.Argument(..., metavar="RESULT.json...",
                                       help="result files; the first is the baseline"),
    fmt: str = typer.Option("table", "--format", "-f", help="table, markdown, csv or json"),
) -> None:
    """Put results side by side: each metric per job, with ratio and change to the first."""
    from gpufio.results import compare as cmp
    from gpufio.results import load as results

    with _exit_codes():
        if fmt not in cmp.FORMATS:
            raise BadInput(f"--format: {fmt!r} is not one of {', '.join(cmp.FORMATS)}")
        docs = [results.load(str(f)) for f in files]
        labels = [f.stem if [g.stem for g in files].count(f.stem) == 1 else str(f) for f in files]
        for note in results.latency_notes(docs, labels):
            typer.echo(f"gpufio: note: {note}", err=True)
        sys.stdout.write(cmp.render(docs, labels, fmt, _stdout_console()))


@app.command()
def plot(
    files: list[Path] = typer.Argument(..., metavar="RESULT.json...", help="result files"),
    output: Path = typer.Option(..., "--output", "-o", help="FILE.png or FILE.svg"),
) -> None:
    """Draw IOPS over time, latency percentiles and per-job IOPS bars, or a GNN result's
    stages stacked per job (needs gpufio[plot])."""
    from gpufio.results import load as results
    from gpufio.results import plot as plotting

    with _exit_codes():
        docs = [results.plottable(str(f)) for f in files]
        plotting.draw(docs, [f.stem for f in files], str(output))
        typer.echo(f"{output}: written")


CONFIDENCE = typer.Option(DEFAULT_CONFIDENCE, "--confidence", min=0.5, max=0.9999,
                          help="how sure a change must be before it fails (the rank interval's "
                          "level); 0.99 needs 5 runs a side, 0.95 needs 4; with fewer runs the "
                          "limit alone decides")


def _load_all(paths: list[Path]) -> list[dict]:
    from gpufio.results import load as results

    return [results.load(str(p)) for p in paths]


def _write_text(path: Path, text: str, option: str) -> None:
    try:
        path.write_text(text)
    except OSError as e:
        raise BadInput(f"{option} {path}: {e.strerror}") from None


@app.command()
def check(
    result_paths: list[Path] = typer.Argument(..., metavar="RESULT.json...",
                                              help="the run to judge: a file (one run or "
                                              "--repeat), or several (their runs together)"),
    baseline_paths: list[Path] = typer.Option(..., "--baseline", "-b",
                                              help="the baseline: a --repeat run or a "
                                              "'gpufio baseline' file; repeat for several files"),
    max_drop: list[str] = typer.Option([], "--max-drop", metavar="METRIC=N%",
                                       help="largest allowed fall of iops or bw"),
    max_rise: list[str] = typer.Option([], "--max-rise", metavar="METRIC=N%",
                                       help="largest allowed rise of lat_* or cpu_per_io"),
    confidence: float = CONFIDENCE,
    junit: Optional[Path] = typer.Option(None, "--junit", help="write JUnit XML here"),
    markdown: Optional[Path] = typer.Option(None, "--markdown",
                                            help="write a Markdown summary here (a "
                                            "pull-request comment)"),
    suggest: bool = typer.Option(False, "--suggest-limits",
                                 help="also print the tightest limit per metric that the "
                                 "runs let the gate detect"),
    paired: Optional[bool] = typer.Option(None, "--paired/--unpaired",
                                          help="compare each result run with its baseline "
                                          "run in file order / as two sets (default: paired "
                                          "when the runs alternate in time)"),
) -> None:
    """Exit 1 if a metric moved the wrong way past its limit (the profile's [check] by
    default) and, given runs enough to tell, beyond the noise: the pairs' when baseline and
    result runs were interleaved, else the baseline's run-to-run spread."""
    from gpufio.results import baseline as base_file
    from gpufio.results import check as gate
    from gpufio.results import load as results
    from gpufio.results import render, report

    with _exit_codes():
        found, baseline = _load_all(result_paths), _load_all(baseline_paths)
        known = results.metrics_of(found[0])
        limits = {**gate.parse_limits(max_drop, "--max-drop", rising=False, known=known),
                  **gate.parse_limits(max_rise, "--max-rise", rising=True, known=known)}
        if suggest:
            render.render(base_file.rows(baseline, confidence, found, paired), "table",
                          title="limits the runs support",
                          left=("job", "metric"), console=_stdout_console())
        if not limits:
            limits = found[0].get("check") or {}
        if not limits:
            if suggest:
                return
            raise BadInput(f"{result_paths[0]}: no limits: give --max-drop/--max-rise, or run "
                           "a profile with a [check] table")
        warnings = gate.warnings(found, baseline)
        for warning in warnings:
            typer.echo(f"gpufio: WARNING: {warning}", err=True)
        for name, mode in gate.modes(found, baseline, paired).items():
            typer.echo(f"job '{name}': {mode}")
        findings = gate.check(found, baseline, limits, confidence, paired)
        for f in findings:
            typer.echo(report.line(f))
        if os.environ.get("GITHUB_ACTIONS") == "true":
            for a in report.annotations(findings, warnings):
                typer.echo(a)
        if junit is not None:
            _write_text(junit, report.junit_xml(findings), "--junit")
        if markdown is not None:
            _write_text(markdown, report.markdown(findings, warnings), "--markdown")
        if not all(f.passed for f in findings):
            raise typer.Exit(EXIT_FAILED)


@app.command()
def baseline(
    files: list[Path] = typer.Argument(..., metavar="RESULT.json...",
                                       help="runs of one profile: --repeat results or single runs"),
    output: Optional[Path] = typer.Option(None, "--output", "-o",
                                          help="write the baseline (every run kept) here"),
    confidence: float = CONFIDENCE,
) -> None:
    """Fold runs into one baseline file for check, and show each metric's run-to-run spread
    and the tightest limit it supports."""
    from gpufio.results import baseline as base_file
    from gpufio.results import render

    with _exit_codes():
        docs = _load_all(files)
        doc = base_file.make(docs, [str(f) for f in files])
        if output is not None:
            _write_text(output, json.dumps(doc, indent=2) + "\n", "--output")
        render.render(base_file.rows([doc], confidence), "table",
                      title=f"baseline of {sum(doc['baseline']['runs'].values())} job runs",
                      left=("job", "metric"), console=_stdout_console())
        if output is not None:
            typer.echo(f"{output}: written")


@app.command()
def prepare(
    profile_path: Path = typer.Argument(..., metavar="PROFILE",
                                        help="job profile: TOML, or a fio job file ending in .fio"),
    set_: list[str] = typer.Option([], "--set", "-s", metavar="KEY=VALUE",
                                   help="override a profile key in every job (repeatable); "
                                   "VALUE is TOML: 'targets=[\"/a\", \"/b\"]', or bare: 4k, /a,/b"),
    yes: bool = YES,
) -> None:
    """Lay out what the profile's jobs read or write (missing target files filled with
    gpufio's data pattern, a GNN job's graph and feature table, a checkpoint's files)."""
    from gpufio import api, profile

    with _exit_codes(), _layout_consent(yes):
        prof = profile.load(str(profile_path), profile.parse_set(set_))
        workload = api.workload_of(prof)
        seen: set[str] = set()
        for job in prof.jobs:
            for path in workload.targets(job, True):
                if path not in seen:
                    seen.add(path)
                    typer.echo(f"{path}: ready")


@app.command()
def clean(
    directory: list[str] = typer.Option([], "--directory", "-d",
                                        help="also look here (default: the scratch directory)"),
    dry_run: bool = typer.Option(False, "--dry-run", "-n", help="list, remove nothing"),
) -> None:
    """Remove the files gpufio laid out: every file carrying its pattern header (whatever its
    name: targets of profiles and fio job files too), GNN tables and graphs, checkpoints."""
    from gpufio.core import targets as tg
    from gpufio.core.units import format_size
    from gpufio.workloads import all_workloads

    with _exit_codes():
        dirs = [tg.default_scratch_dir(), *directory]
        names = re.compile("|".join(f"(?:{w.scratch})" for w in all_workloads().values()))
        files = tg.scratch_files(dirs, names)
        total = 0
        for path in files:
            size = os.path.getsize(path)
            total += size
            if not dry_run:
                try:
                    os.unlink(path)
                except OSError as e:
                    raise BadInput(f"{path}: cannot remove: {e.strerror}") from None
            typer.echo(f"{'would remove' if dry_run else 'removed'} {path} ({format_size(size)})")
        verb = "would free" if dry_run else "freed"
        typer.echo(f"{len(files)} files gpufio laid out in {', '.join(dirs)}; {verb} "
                   f"{format_size(total)}")


@app.command()
def engines(fmt: str = typer.Option("table", "--format", "-f", help="table or json")) -> None:
    """List the data paths, whether each can run on this host, and why not."""
    with _exit_codes():
        if fmt not in ("table", "json"):
            raise BadInput(f"--format: {fmt!r} is not one of table, json")
        from gpufio.engines import all_engines

        rows = [{"engine": name, **cls.availability(),
                 "path": cls.summary, "peer": cls.peer, "iodepth": cls.iodepth_means,
                 "options": {o.name: {"default": o.default, "help": o.help} for o in cls.options}}
                for name, cls in all_engines().items()]
        if fmt == "json":
            typer.echo(json.dumps(rows, indent=2))
            return
        from gpufio.results import render

        for r in rows:
            r["options"] = ", ".join(r["options"])
            for side in ("host memory", "GPU memory"):
                w = r[side]
                r[side] = ("-" if not w["moves"] else f"no: {w['why not']}" if w["why not"]
                           else f"yes: {', '.join(w['moves'])}")
            del r["available"], r["why not"]
        render.render(rows, "table", title="gpufio engines (host memory: block jobs of the CPU "
                      "paths, rows and tensors of device = \"cpu\" jobs)", left=tuple(rows[0]),
                      console=_stdout_console())


# the --format of the commands that print a table or JSON
TABLE_OR_JSON = typer.Option("table", "--format", "-f", help="table or json")


def _profile_and_targets(help_profile: str, help_target: str) -> tuple[Any, Any]:
    """The [PROFILE] argument and --target option of the commands that describe a host."""
    return (typer.Argument(None, metavar="[PROFILE]", help=help_profile),
            typer.Option([], "--target", "-t", help=help_target))


_INFO_ARGS = _profile_and_targets("also describe this profile's targets",
                                  "describe this file or device")
_DOCTOR_ARGS = _profile_and_targets("check what this profile's jobs need",
                                    "also check this target")


# facts holding a byte count, by the key's ending: info's table shows them with a unit (its
# JSON keeps the bytes)
_BYTE_KEYS = ("_bytes", "_size", "_align")


def _fact_row(key: str, value: Any) -> dict[str, Any]:
    """One row of info's table: a byte count as 23.5GiB, under its key less "_bytes"."""
    from gpufio.core.units import format_size

    if key.endswith(_BYTE_KEYS) and type(value) is int:
        return {"key": key.removesuffix("_bytes"), "value": format_size(value)}
    return {"key": key, "value": value}


@app.command()
def info(profile_path: Optional[Path] = _INFO_ARGS[0], target: list[str] = _INFO_ARGS[1],
         fmt: str = TABLE_OR_JSON) -> None:
    """Describe this host as a storage + GPU benchmark sees it (like gdscheck -p)."""
    from gpufio import api, profile
    from gpufio.engines import all_engines
    from gpufio.facts import device as devinfo
    from gpufio.facts import host as hostinfo
    from gpufio.io import gpu, uring
    from gpufio.results import render

    with _exit_codes():
        paths = list(target)
        if profile_path is not None:
            prof = profile.load(str(profile_path))
            workload = api.workload_of(prof)
            for job in prof.jobs:
                paths.extend(p for p in workload.targets(job, False) if p not in paths)
        if fmt not in ("table", "json"):
            raise BadInput(f"--format: {fmt!r} is not one of table, json")
        facts = {"host": hostinfo.host_facts(), "io_uring": uring.probe(),
                 "gpus": gpu.gpu_facts(), "gpu_status": gpu.probe()[1] or "ok",
                 "engines": {n: c.status() for n, c in all_engines().items()},
                 "targets": {}}
        for p in paths:
            try:
                facts["targets"][p] = devinfo.path_facts(p)
            except OSError as e:
                facts["targets"][p] = {"error": e.strerror}
        if fmt == "json":
            typer.echo(json.dumps(facts, indent=2))
            return
        console = _stdout_console()
        sections = [("host", facts["host"]), ("io_uring", facts["io_uring"]),
                    ("engines", facts["engines"])]
        sections += [(f"gpu {g['index']}", g) for g in facts["gpus"]]
        if not facts["gpus"]:
            sections.append(("gpus", {"status": facts["gpu_status"]}))
        sections += [(f"target {p}", f) for p, f in facts["targets"].items()]
        for title, mapping in sections:
            rows = [_fact_row(k, v) for k, v in mapping.items()]
            console.print(render.table(rows, title, left=("key", "value"), show_header=False))


@app.command()
def doctor(profile_path: Optional[Path] = _DOCTOR_ARGS[0], target: list[str] = _DOCTOR_ARGS[1],
           fmt: str = TABLE_OR_JSON) -> None:
    """Say, per check, ok / warn / fail, what was found and the fix: cuFile's mode and why,
    io_uring for GPU-initiated I/O, MPS, the targets and the PCIe links (exit 1 on a fail)."""
    from gpufio import api, profile
    from gpufio.results import render
    from gpufio import doctor as checks

    with _exit_codes():
        if fmt not in ("table", "json"):
            raise BadInput(f"--format: {fmt!r} is not one of table, json")
        jobs, paths = [], None
        if profile_path is not None:
            prof = profile.load(str(profile_path))
            jobs, paths = prof.jobs, api.workload_of(prof).targets
        found = [c.row() for c in checks.diagnose(
            jobs, list(target), paths=None if paths is None else lambda j: paths(j, False))]
        headline = checks.headline()
        if fmt == "json":
            typer.echo(json.dumps({"headline": headline, "checks": found}, indent=2))
        else:
            render.render(found, "table", title=f"gpufio doctor: {headline}" if headline
                          else "gpufio doctor",
                          left=("area", "name", "status", "found", "fix"),
                          console=_stdout_console())
        if any(c["status"] == "fail" for c in found):
            raise typer.Exit(EXIT_FAILED)


def main() -> None:
    """Parse and run a command line (gpufio/__main__.py, the console script's entry, sends
    every one here but the top-level --help)."""
    app()
