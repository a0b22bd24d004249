"""Fixtures of the fio band's tests: fio itself, where it is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


@pytest.fixture
def fio_json(tmp_path: Path):
    """Run fio itself with the arguments given (the test is skipped where fio is not
    installed) and return the path of what it printed, fio.json in the test's directory."""
    if not shutil.which("fio"):
        pytest.skip("fio not installed")

    def run(*args: str) -> Path:
        out = tmp_path / "fio.json"
        out.write_text(subprocess.run(["fio", *args], capture_output=True, text=True,
                                      check=True).stdout)
        return out
    return run
