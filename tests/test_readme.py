"""The README is the profile reference: every key gpufio accepts must be documented there."""

from pathlib import Path

from gpufio.engines import all_engines
from gpufio.profile import COMMON_OPTIONS, GLOBAL_ONLY, GROUPING
from gpufio.workloads import all_workloads, run_keys

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_every_profile_key_is_documented():
    keys = [o.name for o in COMMON_OPTIONS + run_keys().options + GLOBAL_ONLY + GROUPING]
    keys += [o.name for w in all_workloads().values() for o in w.options]
    keys += [o.name for cls in all_engines().values() for o in cls.options]
    missing = [k for k in keys if f"| `{k}` |" not in README]
    assert not missing, f"README lacks rows for {missing}"


def test_every_engine_is_in_the_engines_table():
    missing = [name for name in all_engines() if f"| `{name}` |" not in README]
    assert not missing


def test_readme_commands_are_the_ci_commands():
    ci = (Path(__file__).resolve().parent.parent / ".ci" / "run").read_text()
    assert "python3 -m pip install '.[test]' && python3 -m pytest -q" in README
    assert "python3 -m pip install '.[test]' && python3 -m pytest -q" in ci
    assert "python3 -m pip install . && gpufio run profiles/quick.toml" in README
