"""The README is the profile reference: every key gpufio accepts must be documented there."""

import re
from pathlib import Path

from gpufio import profile
from gpufio.engines import all_engines
from gpufio.profile import COMMON_OPTIONS, GLOBAL_ONLY
from gpufio.workloads import all_workloads, run_keys

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_every_profile_key_is_documented():
    keys = [o.name for o in COMMON_OPTIONS + run_keys().options + GLOBAL_ONLY]
    keys += [o.name for w in all_workloads().values() for o in w.options]
    keys += [o.name for cls in all_engines().values() for o in cls.options]
    missing = [k for k in keys if f"| `{k}` |" not in README]
    assert not missing, f"README lacks rows for {missing}"


def test_every_engine_is_in_the_engines_table():
    missing = [name for name in all_engines() if f"| `{name}` |" not in README]
    assert not missing


def _sh_lines(text: str) -> list[str]:
    """The lines of the README's ```sh blocks."""
    return [line for block in text.split("```sh\n")[1:] for line in
            block.split("```")[0].splitlines()]


def test_readme_commands_are_the_ci_commands():
    ci = (Path(__file__).resolve().parent.parent / ".ci" / "run").read_text()
    test_command = ci.rstrip().splitlines()[-1]  # .ci/run ends with the test command
    assert test_command.startswith("python3 -m pip install '.[test]' && python3 -m pytest")
    assert test_command in _sh_lines(README)  # the README's, to the character
    # the README promises each skipped test's reason: pytest prints them with -rs
    assert " -rs" in test_command and "with the reason" in README
    assert "python3 -m pip install . && gpufio run profiles/quick.toml" in _sh_lines(README)


def test_the_quick_starts_reading_time_is_the_profiles():
    """The README's quick-start time is the sum of the profile's ramp and run times, so
    neither can change without the other."""
    jobs = profile.load(str(Path(__file__).resolve().parent.parent / "profiles/quick.toml")).jobs
    each = {(j.ramp_time + j.runtime) / 1e9 for j in jobs}
    m = re.search(r"reads it for (\d+) seconds, (\w+) jobs of (\d+) s each", README)
    assert m, "the README's quick start no longer says how long it reads"
    words = {"two": 2, "three": 3, "four": 4, "five": 5}
    assert (int(m[1]), words[m[2]], {int(m[3])}) == (
        sum((j.ramp_time + j.runtime) / 1e9 for j in jobs), len(jobs), each)
