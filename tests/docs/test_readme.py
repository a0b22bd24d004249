"""The README's two commands: present, and the test command exactly the one .ci/run runs.
(The key reference is generated: tests/docs/test_docs.py keeps docs/reference/ current.)"""

import re

from gpufio import profile

from checkout import REPO as ROOT

README = (ROOT / "README.md").read_text()
INSTALL_AND_RUN = "python3 -m pip install . && gpufio run profiles/quick.toml"
TEST_PREFIX = "python3 -m pip install '.[test]' && python3 -m pytest"


def _command_lines(text: str) -> list[str]:
    """The lines of the fenced sh blocks of a Markdown text."""
    lines, inside = [], False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            inside = not inside and line.strip().startswith("```sh")
        elif inside:
            lines.append(line.strip())
    return lines


def test_the_readme_gives_the_install_and_run_command():
    assert INSTALL_AND_RUN in _command_lines(README)


def test_the_readme_test_command_is_the_one_ci_runs():
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip().startswith(TEST_PREFIX)]
    readme = [line for line in _command_lines(README) if line.startswith(TEST_PREFIX)]
    assert len(ci) == 1 and readme == ci


def test_the_quick_starts_reading_time_is_the_profiles():
    """The README's quick-start time is the sum of the profile's ramp and run times, so
    neither can change without the other."""
    jobs = profile.load(str(ROOT / "profiles/quick.toml")).jobs
    each = {(j.ramp_time + j.runtime) / 1e9 for j in jobs}
    m = re.search(r"reads it for (\d+) seconds, (\w+) jobs of (\d+) s each", README)
    assert m, "the README's quick start no longer says how long it reads"
    words = {"two": 2, "three": 3, "four": 4, "five": 5}
    assert (int(m[1]), words[m[2]], {int(m[3])}) == (
        sum((j.ramp_time + j.runtime) / 1e9 for j in jobs), len(jobs), each)
