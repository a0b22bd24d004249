"""Runs in the NVMe rig's guest for the whole boot: one interpreter that has imported gpufio's
CLI (and built its compiled helpers) once, then runs each step of a batch in a child forked
from itself, since under TCG starting Python and importing gpufio's dependencies costs far
more than most commands themselves.

Each child is a process of its own (its own process group, its fds 1 and 2 on files, stdin
/dev/null) and runs its step as the command line would: a gpufio argument list as
``python3 -m gpufio ARGV``, ``{"py": PATH, "args": [...]}`` as ``python3 PATH ARGS``,
``{"sh": CMD}`` as ``sh -c CMD``. Its exit status, stdout and stderr are the step's result.

Usage: ``python3 tests/rig_batch.py DIR PREBUILT`` (PREBUILT: the compiled helpers the host
built, tests/rig.py; the FIFOs DIR/req and DIR/rep exist: the rig's
start-up script makes them before the interpreter starts, so a request written early waits
for it). Per request line ``IN OUT SECONDS`` on DIR/req: runs the steps of the JSON list IN
within SECONDS (a step still running then is killed with its process group, later ones are
not started: status 124), writes one ``{"rc", "stdout", "stderr"}`` per step to OUT and
answers ``done`` on DIR/rep.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import pkgutil
import runpy
import select
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the checkout under test, as `python3 -m gpufio` from its root

import gpufio  # noqa: E402
from gpufio import cli  # noqa: E402
from gpufio.core import pattern  # noqa: E402
from gpufio.native import build as native  # noqa: E402
from gpufio.io import loops  # noqa: E402

TIMED_OUT = 124


def _child(step: list[str] | dict, out: Path, err: Path) -> None:
    """In the forked child: become the step's process, run it, never return."""
    code = 1
    try:
        os.setpgid(0, 0)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 1)
        os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 2)
        if isinstance(step, dict) and "sh" in step:
            os.execv("/bin/sh", ["sh", "-c", step["sh"]])
        try:
            if isinstance(step, dict):
                sys.argv = [step["py"], *step.get("args", [])]
                sys.path[0] = os.path.dirname(os.path.abspath(step["py"]))
                runpy.run_path(step["py"], run_name="__main__")
            else:
                sys.argv = [str(REPO / "gpufio" / "__main__.py"), *step]
                cli.main()
            code = 0
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _wait(pid: int, deadline: float) -> int:
    """The child's exit status; past ``deadline`` its process group is killed: 124."""
    fd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            os.killpg(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
    return TIMED_OUT if not ready else os.waitstatus_to_exitcode(status)


def run_batch(steps: list, base: Path, seconds: float) -> list[dict]:
    """Each step in a child of its own, one after another, within ``seconds`` in all."""
    deadline = time.monotonic() + seconds
    results = []
    for i, step in enumerate(steps):
        if time.monotonic() >= deadline:
            results.append({"rc": TIMED_OUT, "stdout": "", "stderr": "not run: out of time"})
            continue
        out, err = base.with_suffix(f".{i}.out"), base.with_suffix(f".{i}.err")
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(step, out, err)
        try:  # here too, so a kill at the deadline never misses a child not yet in its group
            os.setpgid(pid, pid)
        except OSError:  # it has exec'd (its own call came first) or gone
            pass
        t0 = time.monotonic()
        rc = _wait(pid, deadline)
        log(f"step {i} ({json.dumps(step)[:120]}): status {rc}, {time.monotonic() - t0:.1f} s")
        results.append({"rc": rc, "stdout": out.read_text(errors="replace"),
                        "stderr": err.read_text(errors="replace")})
    return results


def log(what: str) -> None:
    """One line on the interpreter's log (SHARE/cmd/warm.out): how long the guest took."""
    print(f"rig_batch: [{time.clock_gettime(time.CLOCK_BOOTTIME):.1f}] {what}", flush=True)


def warm_up() -> None:
    """Import every gpufio module and build the compiled helpers, once for every child."""
    log(f"interpreter up, gpufio's CLI imported ({len(sys.modules)} modules)")
    for mod in pkgutil.walk_packages(gpufio.__path__, "gpufio."):
        if mod.name != "gpufio.__main__":  # it runs the CLI
            try:
                importlib.import_module(mod.name)
            except Exception as e:  # a module for hardware this guest lacks: its child pays
                log(f"{mod.name} not imported: {e}")
    log(f"gpufio imported ({len(sys.modules)} modules)")
    loops.available()
    pattern.native_fill()
    log("compiled helpers ready")
    # what is imported now stays out of every child's collections: a collection would touch,
    # and so copy, each page the child shares with this process
    gc.freeze()


def _use_prebuilt(prebuilt: Path) -> None:
    """Let gpufio take the compiled helpers the host built (tests/rig.py's _build_helpers)
    where it would build them: named ``NAME-DIGEST-MACHINE.so``, so ``NAME.so`` here."""
    build = native._build

    def install(cc: str, lib: Path, sources: tuple[Path, ...], options: tuple[str, ...]) -> bool:
        built = prebuilt / f"{lib.name.split('-', 1)[0]}.so"
        if not built.exists():
            return build(cc, lib, sources, options)
        lib.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, lib)
        return True

    native._build = install


def main() -> None:
    """Warm up, then serve requests until the guest goes down."""
    fifos = Path(sys.argv[1])
    _use_prebuilt(Path(sys.argv[2]))
    warm_up()
    while True:
        with open(fifos / "req") as f:
            line = f.readline().split()
        if len(line) != 3:
            continue
        ins, outs, seconds = Path(line[0]), Path(line[1]), float(line[2])
        results = run_batch(json.loads(ins.read_text()), outs, seconds)
        outs.write_text(json.dumps(results))
        with open(fifos / "rep", "w") as f:
            f.write("done\n")


if __name__ == "__main__":
    main()
