"""The README's two commands: present, and the test command exactly the one .ci/run runs.
(The key reference is generated: tests/test_docs.py keeps docs/reference/ current.)"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
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
