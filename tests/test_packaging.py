"""A wheel carries every file gpufio reads beside its modules: the CUDA kernels, the C sources
its compiled loops and pattern fill are built from, the top-level help text. A file left out
of package-data is missing from every `pip install .` (the compiled loops would quietly fall
back to Python)."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_non_python_file_of_the_package_is_package_data():
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["gpufio"]
    package = ROOT / "gpufio"
    files = [p.relative_to(package).as_posix() for p in package.rglob("*")
             if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
    assert files
    missing = [f for f in files if not any(fnmatch.fnmatch(f, pat) for pat in patterns)]
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"
