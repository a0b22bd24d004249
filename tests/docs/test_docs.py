"""The docs stay true to the tree: the generated reference is current, every relative link
in the Markdown resolves, and nothing points outside the repository or at the team's own
work log."""

import importlib.util
import re
from pathlib import Path

from checkout import REPO as ROOT



def _generator():
    spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _markdown() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
            *sorted((ROOT / "bench").glob("*.md"))]


def test_the_reference_is_generated_from_the_current_code():
    stale = [str(p.relative_to(ROOT)) for p, text in _generator().render().items()
             if not p.exists() or p.read_text() != text]
    assert not stale, f"{stale} are stale: run python3 docs/generate.py"


def test_the_reference_has_every_key_engine_and_command():
    from gpufio.engines import all_engines
    from gpufio.profile import COMMON_OPTIONS, GLOBAL_ONLY
    from gpufio.workloads import all_workloads, run_keys

    text = "".join(_generator().render().values())
    keys = [o.name for o in COMMON_OPTIONS + run_keys().options + GLOBAL_ONLY]
    keys += [o.name for w in all_workloads().values() for o in w.options]
    keys += [o.name for cls in all_engines().values() for o in cls.options]
    assert [k for k in keys if f"| `{k}` |" not in text] == []
    assert [e for e in all_engines() if f"## `{e}`" not in text] == []
    for command in ("run", "compare", "check", "doctor", "engines", "clean"):
        assert f"## `gpufio {command} " in text


def test_every_relative_link_in_the_docs_resolves():
    broken = []
    for md in _markdown():
        for target in re.findall(r"\]\(([^)\s]+)\)", md.read_text()):
            path = target.split("#")[0]
            if path and "://" not in path and not path.startswith("mailto:"):
                if not (md.parent / path).exists():
                    broken.append(f"{md.relative_to(ROOT)}: {target}")
    assert broken == []


# what only the team's work log explains: its issue and session numbers, a design file
# that is not in the repository, the folder beside the checkout
_OUTSIDE = re.compile(r"\b[Ii]ssues? \d{1,2}\b|\b[Ss]essions? \d|DESIGN\.md|\.\./shared")
# in code, a pointer to the results names the section it means
_UNANCHORED = re.compile(r"PERFORMANCE\.md(?![:,][^\"]*\")")


def test_nothing_points_at_the_work_log_or_outside_the_repository():
    code = [p for folder in ("gpufio", "bench", "tests", "rig") for p in (ROOT / folder).rglob("*")
            if p.suffix in (".py", ".cu", ".cuh", ".c", ".sh") and p.is_file()
            and p != Path(__file__).resolve()]
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
             for p in [*_markdown(), *ROOT.glob("profiles/*.toml"), *code]
             for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
             if _OUTSIDE.search(line) or (p in code and _UNANCHORED.search(line))]
    assert found == []


def test_the_readme_and_the_current_numbers_stay_short():
    """The README is the way in (the rest is the tutorial's), and PERFORMANCE.md holds the
    current numbers, not a log: each keeps to its length."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
    assert len((ROOT / "docs" / "PERFORMANCE.md").read_text().splitlines()) <= 300
