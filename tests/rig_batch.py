"""Runs in the NVMe rig's guest: several gpufio commands in one interpreter, each as the CLI
runs it (typer's runner: exit code, stdout and stderr apart), since under TCG starting Python
and importing gpufio's dependencies costs far more than most commands themselves.

Usage: python3 tests/rig_batch.py ARGVS.json RESULTS.json (a list of argument lists in; one
{"rc", "stdout", "stderr"} per command out)."""

import json
import sys
import traceback

from typer.testing import CliRunner

from gpufio.cli import app


def main() -> None:
    """Run each command of the list, write each one's outcome."""
    with open(sys.argv[1]) as f:
        argvs = json.load(f)
    results = []
    for argv in argvs:
        res = CliRunner().invoke(app, argv)
        err = res.stderr
        if res.exc_info and not isinstance(res.exception, SystemExit):
            err += "".join(traceback.format_exception(*res.exc_info))
        results.append({"rc": res.exit_code, "stdout": res.stdout, "stderr": err})
    with open(sys.argv[2], "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
