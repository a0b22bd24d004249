"""Every tutorial command that needs no GPU, drive or root runs as written: the fenced blocks
tagged `sh test` of docs/tutorial/*.md (the convention is in docs/tutorial/README.md), each
as one bash script in a fresh directory, with this checkout's gpufio and the scratch and
cache directories in the test's temporary directory."""

import importlib.util
import os
import re
import shutil
import stat
import subprocess
import sys

import pytest

from checkout import REPO as ROOT

PAGES = sorted((ROOT / "docs" / "tutorial").glob("[0-9]*.md"))
# `CMD # exit 2` or `CMD # exit 0|1`: the exit codes the command may end with
_EXPECTS = re.compile(r"^(?P<cmd>.*\S)\s+# exit (?P<codes>\d+(?:\|\d+)*)$")


def blocks(text: str, tag: str) -> list[str]:
    """The bodies of the fenced blocks whose info string is exactly ``tag``."""
    return re.findall(rf"^```{re.escape(tag)}\n(.*?)^```$", text, re.M | re.S)


def missing(body: str) -> list[str]:
    """What a block's `# needs: ...` first line names that this host lacks: commands on
    PATH, or `python:MODULE` for a module this interpreter cannot import."""
    first = body.splitlines()[0] if body else ""
    if not first.startswith("# needs: "):
        return []
    return [n for n in first[len("# needs: "):].split()
            if not (importlib.util.find_spec(n[7:]) if n.startswith("python:") else shutil.which(n))]


def script(body: str) -> str:
    """A block as a bash script: stop at the first command that ends otherwise than its
    line says (exit 0 unless `# exit N`)."""
    lines = ["set -eo pipefail"]
    for line in body.splitlines():
        m = _EXPECTS.match(line)
        if m:
            codes = " ".join(m["codes"].split("|"))
            lines.append(f"set +e; {m['cmd']}; rc=$?; set -e; case \" {codes} \" in "
                         f"*\" $rc \"*) ;; *) echo \"exit $rc, not {m['codes']}: "
                         f"{m['cmd']}\" >&2; exit 97;; esac")
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """The scratch and cache directories every page shares (a file laid out once), and a
    `gpufio` on PATH that is this checkout's."""
    base = tmp_path_factory.mktemp("tutorial")
    bin_dir = base / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "gpufio"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -m gpufio \"$@\"\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(ROOT), "GPUFIO_SCRATCH": str(base / "scratch"),
           "XDG_CACHE_HOME": str(base / "cache")}
    env.pop("GITHUB_ACTIONS", None)
    (base / "scratch").mkdir()
    return env


def test_the_tutorial_has_runnable_commands_and_marks_the_rest():
    runnable = [b for p in PAGES for b in blocks(p.read_text(), "sh test")]
    assert len(runnable) >= 8
    for page in PAGES:
        for body in blocks(page.read_text(), "sh pending"):
            assert body.startswith("# pending: "), f"{page.name}: say what it waits for"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_every_runnable_command_of_the_page_runs(page, shared, tmp_path):
    bodies = blocks(page.read_text(), "sh test")
    if not bodies:
        pytest.skip(f"{page.name} has no command that runs without a GPU, drive or root")
    (tmp_path / "profiles").symlink_to(ROOT / "profiles")
    lacking = []
    for n, body in enumerate(bodies, 1):
        if missing(body):
            lacking += missing(body)
            continue
        res = subprocess.run(["bash", "-c", script(body)], cwd=tmp_path, env=shared,
                             capture_output=True, text=True, timeout=900)
        assert res.returncode == 0, (f"{page.name}, block {n}: exit {res.returncode}\n"
                                     f"{res.stderr[-3000:]}")
    if lacking:
        pytest.skip(f"{page.name}: blocks needing {', '.join(lacking)} were not run")


def test_a_command_may_say_how_it_ends():
    def rc(body: str) -> int:
        return subprocess.run(["bash", "-c", script(body)], capture_output=True).returncode

    assert rc("false # exit 1\ntrue") == 0
    assert rc("sh -c 'exit 2' # exit 0|2") == 0
    assert rc("true # exit 2") == 97
    assert rc("false\ntrue") == 1


def test_a_block_may_name_what_it_needs():
    assert missing("# needs: sh python:json\ntrue") == []
    assert missing("# needs: no-such-tool-here python:no_such_module\ntrue") == [
        "no-such-tool-here", "python:no_such_module"]
    assert missing("gpufio run x") == []
