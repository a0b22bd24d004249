"""The layering rule of docs/design/ARCHITECTURE.md, kept by a test: every module of gpufio imports
only from its own band or a band below it, lazy and TYPE_CHECKING imports included, and no
file outside engines/ names an engine. bench/ sits above them all: a bench reaches gpufio
through gpufio.api, as users' code does, and only a bench module that measures a mechanism
below the API (MECHANISMS) reaches gpufio's internals."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "gpufio"
# highest first; the package root (gpufio/__init__.py: the version) sits below everything
BANDS = ("pyg", "cli", "doctor", "api", "profile", "workloads", "results", "fio", "run",
         "loops", "engines", "io", "core", "facts", "native", "")


# public modules beside api.py, in its band: gpu.py is the GPU request API for kernel authors
PUBLIC = {"gpu": "api"}


def band_of(module: str) -> str:
    """'gpufio.io.gio.queue' -> 'io'; 'gpufio.cli' -> 'cli'; 'gpufio.gpu' -> 'api';
    'gpufio' -> ''."""
    parts = module.split(".")[1:]
    if not parts:
        return ""
    return "cli" if parts[0] == "__main__" else PUBLIC.get(parts[0], parts[0])


def modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        name = ".".join(rel.parts)
        out[name.removesuffix(".__init__")] = path
    return out


def imports(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, imported gpufio module) for every import in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("gpufio")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.startswith("gpufio"):
            for a in node.names:  # "from gpufio.io import uring" imports gpufio.io.uring
                sub = f"{node.module}.{a.name}"
                found.append((node.lineno, sub if sub in ALL else node.module))
    return found


ALL = modules()
BENCH = sorted((ROOT.parent / "bench").glob("*.py"))
# bench modules that measure a mechanism below the API (the software NVMe controller driven
# by a CPU driver and by GPU agents): they may import any gpufio module, and only benches
# import them
MECHANISMS = {"_nvme_rates"}


def test_every_module_sits_in_a_known_band():
    assert {band_of(m) for m in ALL} <= set(BANDS)


@pytest.mark.parametrize("module", sorted(ALL))
def test_no_module_imports_from_a_band_above_it(module):
    mine = BANDS.index(band_of(module))
    upward = [f"line {line}: {target} ({band_of(target)})"
              for line, target in imports(ALL[module], module)
              if BANDS.index(band_of(target)) < mine]
    assert not upward, f"{module} ({band_of(module)}) imports from above: {upward}"


def test_no_engine_is_named_outside_engines():
    """Engines are plug-ins: outside engines/ no code names one (a workload asks the
    registry; fio's names are each engine's fio_engines). Strings and comparisons alike."""
    from gpufio.engines import all_engines

    names = set(all_engines())
    found = []
    for module, path in ALL.items():
        if band_of(module) == "engines":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and node.value.strip() in names:  # a bare engine name
                found.append(f"{module}:{node.lineno} {node.value!r}")
    assert found == []


def test_engines_never_import_each_other():
    """As fio's engines: each data path is one module that needs no other."""
    engine_modules = {m for m in ALL if band_of(m) == "engines"
                      and m not in ("gpufio.engines", "gpufio.engines.base")}
    crossed = [f"{m} imports {target} (line {line})" for m in sorted(engine_modules)
               for line, target in imports(ALL[m], m) if target in engine_modules - {m}]
    assert crossed == []


GIO_API = "gpufio.io.gio"
GIO_BACKENDS = "gpufio.io.gio.backends"
# each GPU-initiated transport's modules (rings.py is the io_uring backend's host side)
GIO_TRANSPORTS = ({"uring", "rings"}, {"nvme"})


def test_the_gpu_request_api_names_no_backend_and_backends_no_other():
    """io/gio is the request API every GPU-initiated engine uses, whatever the transport
    (contract, queue, bench, cache); its transports live in io/gio/backends, which import
    the API and never one another. The loops over it are in gpufio/loops."""
    api = [m for m in ALL if m.startswith(f"{GIO_API}.") and not m.startswith(GIO_BACKENDS)]
    assert {"gpufio.io.gio.queue", "gpufio.io.gio.bench", "gpufio.io.gio.cache"} <= set(api)
    reached = [f"{m} imports {target} (line {line})" for m in sorted(api)
               for line, target in imports(ALL[m], m) if target.startswith(GIO_BACKENDS)]
    crossed = []
    for m in sorted(x for x in ALL if x.startswith(f"{GIO_BACKENDS}.")):
        own = next(g for g in GIO_TRANSPORTS if m.rsplit(".", 1)[1] in g)
        crossed += [f"{m} imports {target} (line {line})" for line, target in imports(ALL[m], m)
                    if target.startswith(f"{GIO_BACKENDS}.")
                    and target.rsplit(".", 1)[1] not in own]
    assert reached == [] and crossed == []


def test_gpu_initiated_engines_keep_no_queue_plumbing():
    """What any GPU-initiated engine needs (making a queue, the namespace table) is in
    io/gio; an engine module defines its engine, whose ``queue`` hands one to the loops."""
    engines = [m for m in ALL if band_of(m) == "engines" and any(
        t.startswith(GIO_API) for _, t in imports(ALL[m], m))]
    assert engines
    kept = []
    for m in engines:
        for node in ast.parse(ALL[m].read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name in (
                    "make_queue", "namespace_table", "default_sq_threads", "gpu_price"):
                kept.append(f"{m}:{node.lineno} {node.name}")
    assert kept == []


def test_workloads_never_import_each_other():
    """Each workload is its own module or package (block's runner, document, live view and
    merge under workloads/block/); what two of them share sits in workloads/ itself
    (documents, sequence) or in a lower band (results/live, results/render)."""
    from gpufio.workloads import NAMES

    def owner(module: str) -> str | None:
        parts = module.split(".")
        return parts[2] if len(parts) > 2 and parts[1] == "workloads" and parts[2] in NAMES \
            else None

    crossed = [f"{m} imports {target} (line {line})" for m in sorted(ALL) if owner(m)
               for line, target in imports(ALL[m], m) if owner(target) not in (None, owner(m))]
    assert crossed == []


def test_plumbing_returns_data_instead_of_writing_the_engine_context():
    """io/ hands results back (mismatch indices, thread shares); engines record them."""
    writers = [f"{m} imports {target} (line {line})" for m in sorted(ALL) if band_of(m) == "io"
               for line, target in imports(ALL[m], m) if target == "gpufio.core.context"]
    assert writers == []


def test_no_workload_is_named_outside_workloads():
    """Workloads are plug-ins too: the loader, the CLI and the result tools ask the workload
    registry or read what a document says of itself, and name no workload."""
    from gpufio.workloads import all_workloads

    names = set(all_workloads()) - {"block"}  # also a target kind ("kind": "block")
    for module, path in ALL.items():
        # pyg is the GNN workload's FeatureStore for users' code, over that workload's gather
        if band_of(module) in ("workloads", "pyg"):
            continue
        tree = ast.parse(path.read_text())
        named = [n.lineno for n in ast.walk(tree)
                 if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in names]
        workload_imports = [t for _, t in imports(path, module)
                            if t.startswith("gpufio.workloads.")]
        assert named == [] and workload_imports == [], (module, named, workload_imports)


@pytest.mark.parametrize("path", BENCH, ids=[p.name for p in BENCH])
def test_bench_is_a_package_over_the_api(path):
    """A bench imports gpufio only as gpufio.api (no internals), unless it is a mechanism
    module (MECHANISMS), which may import any of gpufio; and never edits sys.path: it runs as
    ``python3 -m bench.NAME`` from the repository root."""
    module = f"bench.{path.stem}"
    reached = sorted({t for _, t in imports(path, module)} - {"gpufio", "gpufio.api"})
    if path.stem in MECHANISMS:
        reached = [t for t in reached if t not in ALL]  # internals allowed, if they exist
    edits = [n.lineno for n in ast.walk(ast.parse(path.read_text()))
             if isinstance(n, ast.Attribute) and n.attr == "path"
             and getattr(n.value, "id", None) == "sys"]
    assert reached == [] and edits == [], (reached, edits)


def test_mechanism_modules_exist_and_only_benches_use_them():
    """The exception is named, not guessed: each MECHANISMS module is in bench/, reaches
    an internal module, and no module of gpufio imports bench."""
    stems = {p.stem for p in BENCH}
    assert MECHANISMS <= stems
    for stem in MECHANISMS:
        path = ROOT.parent / "bench" / f"{stem}.py"
        assert any(band_of(t) not in ("api", "") for _, t in imports(path, f"bench.{stem}"))
    upward = [m for m, path in ALL.items() for node in ast.walk(ast.parse(path.read_text()))
              if isinstance(node, (ast.Import, ast.ImportFrom))
              and any((getattr(node, "module", None) or a.name).split(".")[0] == "bench"
                      for a in node.names)]
    assert upward == []


@pytest.mark.parametrize("path", [p for p in BENCH if not p.stem.startswith("_")],
                         ids=[p.name for p in BENCH if not p.stem.startswith("_")])
def test_every_bench_answers_help(path):
    """Each bench loads and says how it is run without a GPU, fio or root: its usage and
    the first line of its docstring."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", f"bench.{path.stem}", "--help"],
                         capture_output=True, text=True, cwd=ROOT.parent)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"usage: {path.name} [-h]")
    first = ast.get_docstring(ast.parse(path.read_text())).splitlines()[0]  # its description
    assert " ".join(first.split()) in " ".join(res.stdout.split())


def test_one_renderer_builds_every_table():
    """Tables come from results/render.py only: no other module (bench/ included) builds a
    Rich table, calls tabulate or writes CSV by hand."""
    makers = []
    for module, path in [*ALL.items(), *((f"bench.{p.stem}", p) for p in BENCH)]:
        if module == "gpufio.results.render":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in ("Table", "tabulate", "DictWriter", "writer"):
                    makers.append(f"{module}:{node.lineno} {name}")
    assert makers == []


def test_csv_cells_are_quoted():
    from gpufio.results.render import render

    text = render([{"job": "a,b", "note": 'say "hi"'}], "csv")
    assert text.splitlines() == ["job,note", '"a,b","say ""hi"""']


def test_code_below_the_cli_emits_events_instead_of_printing():
    """Only the CLI and the result renderers write to the terminal; other bands emit events
    (core/events.py), so a quiet run or a test decides where their lines go."""
    allowed = {"gpufio.cli", "gpufio.core.events", "gpufio.results.render",
               "gpufio.workloads.block.document", "gpufio.workloads.block.live"}
    printing = []
    for module, path in ALL.items():
        if module in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                printing.append(f"{module}:{node.lineno}")
    assert printing == []


def test_events_reach_the_sink_that_is_set():
    from gpufio.core import events

    got = []
    with events.sink(lambda kind, text: got.append((kind, text))):
        events.emit("layout", "gpufio: laying out x")
    assert got == [("layout", "gpufio: laying out x")]


def test_engines_reach_the_run_only_through_the_context():
    """Engines ask the context (measuring, regions(), budget, next_batch ...), never its
    runner-side objects (ctx.control, ctx.stream)."""
    reached = []
    for module, path in ALL.items():
        if band_of(module) != "engines":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("control", "stream") \
                    and isinstance(node.value, ast.Name) and node.value.id == "ctx":
                reached.append(f"{module}:{node.lineno} ctx.{node.attr}")
            if isinstance(node, ast.Attribute) and node.attr in ("control", "stream") \
                    and isinstance(node.value, ast.Attribute) and node.value.attr == "ctx":
                reached.append(f"{module}:{node.lineno} self.ctx.{node.attr}")
    assert reached == []


def test_engines_read_their_options_typed():
    """Each engine reads its options through its Settings dataclass (built from its Option
    table), never by string key from job.engine_options."""
    keyed = []
    for module, path in ALL.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
                    and node.value.attr == "engine_options":
                keyed.append(f"{module}:{node.lineno}")
    assert keyed == []
    from gpufio.engines import all_engines
    from gpufio.profile import from_dict

    job = from_dict({"global": {"engine": "uring", "targets": ["x"], "sqpoll": True}},
                    "t.toml", {}).jobs[0]
    s = all_engines()["uring"].settings(job)
    assert s.sqpoll is True and s.fixedbufs is False
    with pytest.raises(AttributeError):
        s.sqpoll = False  # frozen


def test_settings_are_read_typed_and_what_was_given_is_not_probed():
    """What the engine or the workload picks is None in its typed settings: no module looks
    at what the profile wrote (options_as_given) but the loader and the result document
    (its "job options"), and the workloads read their keys as typed attributes of
    job.workload_settings, never by string key from job.workload_options."""
    allowed = {"gpufio.profile", "gpufio.workloads.block.document"}
    probes, keyed = [], []
    for module, path in ALL.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute):
                continue
            if node.attr == "options_as_given" and module not in allowed:
                probes.append(f"{module}:{node.lineno}")
            if node.attr == "workload_options" and band_of(module) == "workloads":
                keyed.append(f"{module}:{node.lineno}")
    assert probes == [] and keyed == []


def test_one_watchdog_and_one_stall_error_for_every_path():
    """The stall limit and its error live in io/watchdog.py; no engine keeps its own."""
    from gpufio.io.gio.queue import QueueStalled
    from gpufio.io.watchdog import Stalled

    assert issubclass(QueueStalled, Stalled)
    own = []
    for module, path in ALL.items():
        if module == "gpufio.io.watchdog":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and any(
                    getattr(t, "id", "") == "STALL_LIMIT_NS" for t in node.targets):
                own.append(f"{module}:{node.lineno} STALL_LIMIT_NS")
            if isinstance(node, ast.ClassDef) and node.name.startswith("Stuck"):
                own.append(f"{module}:{node.lineno} {node.name}")
    assert own == []


@pytest.mark.parametrize("module", ["gpufio.loops.block_host", "gpufio.loops.block_staged",
                                    "gpufio.loops.block_gpu_slots"])
def test_cpu_driven_loops_share_the_slot_table(module):
    """Issue stamps, latency and verify dispatch of CPU-driven block loops (an engine's own,
    or one over any engine's channel) live in core/slots.py."""
    assert any(t == "gpufio.core.slots" for _, t in imports(ALL[module], module))
    text = ALL[module].read_text()
    assert "t_issue = np.zeros" not in text and "slot_tgt = np.zeros" not in text


def test_only_the_native_layer_talks_to_c():
    """Only native/ imports ctypes or cuda.bindings or builds a RawModule (NVRTC): library
    loading, signatures, structs and raw memory live in one band."""
    reached = []
    for module, path in ALL.items():
        if band_of(module) == "native":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            reached += [f"{module}:{node.lineno} {n}" for n in names
                        if n.split(".")[0] == "ctypes" or n.startswith("cuda.bindings")]
            if isinstance(node, ast.Attribute) and node.attr == "RawModule":
                reached.append(f"{module}:{node.lineno} RawModule")
    assert reached == []


def test_the_native_layer_is_used_and_names_no_band_above():
    """native/ sits below facts (statx is a fact about a path): it imports only itself."""
    native = [m for m in ALL if band_of(m) == "native"]
    assert {"gpufio.native.libc", "gpufio.native.memory", "gpufio.native.build"} <= set(native)
    users = {m for m in ALL if band_of(m) != "native"
             and any(band_of(t) == "native" for _, t in imports(ALL[m], m))}
    assert {"gpufio.facts.device", "gpufio.core.guard", "gpufio.io.uring",
            "gpufio.io.loops", "gpufio.io.nvme.vfio", "gpufio.io.nvme.compiled",
            "gpufio.io.nvme.drives", "gpufio.io.nvme.cpu_channel"} <= users

