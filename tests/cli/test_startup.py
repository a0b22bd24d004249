"""Start-up imports only what the command needs: which modules a fresh interpreter
holds after the CLI's import and a profile's load, and the registries' name index that lets
a lookup import one module. Module sets, never timings (bench/startup.py times them)."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import subprocess
import sys

import pytest

from checkout import REPO

# what no command may wait for before it needs it
HEAVY = ("numpy", "rich", "tabulate", "pydantic", "cupy", "torch", "kvikio", "mpi4py",
         "matplotlib")


def _modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter in the repository holds after running ``code``."""
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys, json\n"
                          "print(json.dumps(sorted(sys.modules)))"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    return set(json.loads(out.splitlines()[-1]))


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY)


def test_the_cli_imports_no_heavy_module():
    assert _heavy(_modules_after("import gpufio.cli")) == []


def test_a_help_imports_neither_typer_nor_the_commands():
    """The top-level --help prints the kept text (gpufio/help.txt) without typer."""
    modules = _modules_after("import sys\nsys.argv = ['gpufio', '--help']\n"
                             "from gpufio.__main__ import main\n"
                             "try:\n    main()\nexcept SystemExit:\n    pass")
    assert "typer" not in modules and "gpufio.cli" not in modules
    assert _heavy(modules) == []


def test_a_run_parses_its_options_without_pydantic(tmp_path):
    """typer 0.29 coerces each option through pydantic, which costs a run's start more than
    the rest of gpufio's imports: pyproject keeps typer below it."""
    import typer

    if tuple(int(p) for p in typer.__version__.split(".")[:2]) >= (0, 29):
        pytest.skip(f"typer {typer.__version__} is outside pyproject's bound (<0.29); "
                    "pip install . installs one within it")
    prof = tmp_path / "p.toml"
    prof.write_text('[global]\nengine = "null"\nsize = "1m"\nio_size = "4k"\n'
                    '[[job]]\nname = "j"\n')
    modules = _modules_after(
        "import sys\nfrom gpufio.__main__ import main\n"
        f"sys.argv = ['gpufio', 'run', {str(prof)!r}, '-q', '-f', 'json']"
        "\ntry:\n    main()\nexcept SystemExit:\n    pass")
    assert "typer" in modules and "pydantic" not in modules


def test_a_block_profile_loads_only_its_engine_and_workload(tmp_path):
    prof = tmp_path / "p.toml"
    prof.write_text('[global]\nengine = "psync"\nsize = "1m"\n[[job]]\nname = "j"\n')
    modules = _modules_after(f"from gpufio import profile\nprofile.load({str(prof)!r})")
    from gpufio.engines import MODULES
    from gpufio.workloads import NAMES

    loaded = {m for m in modules if m.startswith(("gpufio.engines.", "gpufio.workloads."))}
    engine_modules = {f"gpufio.engines.{m}" for m in MODULES.values()}
    assert loaded & engine_modules == {"gpufio.engines.psync"}
    assert {f"gpufio.workloads.{n}" for n in NAMES} & loaded == {"gpufio.workloads.block"}
    assert [m for m in ("rich", "tabulate", "pydantic") if m in modules] == []


def test_a_block_run_imports_neither_other_workloads_types_nor_statistics(tmp_path):
    """What only GNN rows, checkpoint tensors or a median of repeated runs need stays out of
    a plain block run's start."""
    prof = tmp_path / "p.toml"
    prof.write_text(f'[global]\ndirectory = "{tmp_path}"\nsize = "1m"\nio_size = "64k"\n'
                    '[[job]]\nname = "j"\nengine = "psync"\n')
    modules = _modules_after(
        "import sys\nfrom gpufio.__main__ import main\n"
        f"sys.argv = ['gpufio', 'run', {str(prof)!r}, '-q', '-f', 'json']"
        "\ntry:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code")
    assert "gpufio.run.jobrun" in modules  # it ran
    assert {"gpufio.core.rows", "gpufio.core.tensors", "statistics"} & modules == set()


def test_the_engine_index_names_each_engine_by_its_module():
    """engines.MODULES is what importing every module of engines/ registers, in order."""
    from gpufio import engines

    found = {}
    for info in pkgutil.iter_modules(engines.__path__):
        if info.name != "base":
            module = importlib.import_module(f"gpufio.engines.{info.name}")
            found.update({name: info.name for name, cls in engines._REGISTRY.items()
                          if cls.__module__ == module.__name__})
    assert found == engines.MODULES, "update MODULES in gpufio/engines/__init__.py"
    assert list(engines.all_engines())[:len(engines.MODULES)] == list(engines.MODULES)


def test_each_workload_is_the_module_of_its_name():
    """Importing workloads/NAME registers NAME, and no other module registers a workload."""
    from gpufio import workloads

    code = "\n".join(["from gpufio.workloads import _REGISTRY", "seen = []"]
                     + [f"import gpufio.workloads.{n}\nseen.append({n!r} in _REGISTRY)"
                        for n in workloads.NAMES] + ["print(seen)"])
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == str([True] * len(workloads.NAMES))
    for info in pkgutil.iter_modules(workloads.__path__):
        importlib.import_module(f"gpufio.workloads.{info.name}")
    assert set(workloads.NAMES) <= set(workloads._REGISTRY)
    assert list(workloads.all_workloads())[:len(workloads.NAMES)] == list(workloads.NAMES)


def test_an_unknown_engine_is_a_key_error_after_loading_all():
    from gpufio.engines import all_engines

    assert "no-such-engine" not in all_engines()
    with pytest.raises(KeyError):
        all_engines()["no-such-engine"]


REGENERATE = ("COLUMNS=80 python3 -c \"import sys; sys.argv[0] = 'gpufio'; "
              "from gpufio.cli import main; main()\" --help > gpufio/help.txt")


def test_the_kept_help_is_what_typer_renders():
    rendered = subprocess.run([sys.executable, "-c", "import sys; sys.argv[0] = 'gpufio'\n"
                               "from gpufio.cli import main; main()", "--help"], cwd=REPO,
                              env={**os.environ, "COLUMNS": "80"}, capture_output=True,
                              text=True, check=True).stdout
    assert (REPO / "gpufio" / "help.txt").read_text() == rendered, f"regenerate: {REGENERATE}"


@pytest.mark.parametrize("columns, kept", [("80", True), ("200", True), ("60", False)])
def test_help_prints_the_kept_text_where_typer_would_print_it(columns, kept):
    """As a module the usage line names 'python -m gpufio'; a narrower terminal than the
    kept text's goes to typer, which wraps for it."""
    out = subprocess.run([sys.executable, "-m", "gpufio", "--help"], cwd=REPO,
                         env={**os.environ, "COLUMNS": columns}, capture_output=True,
                         text=True, check=True).stdout
    assert out.startswith("Usage: python -m gpufio [OPTIONS] COMMAND [ARGS]...")
    kept_text = (REPO / "gpufio" / "help.txt").read_text()
    assert (out == kept_text.replace("Usage: gpufio ", "Usage: python -m gpufio ", 1)) == kept
