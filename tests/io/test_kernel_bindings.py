"""io/kernels.py's binding table against the kernel sources: every entry point it names is
declared ``extern "C" __global__`` in its source, taking the descriptors it lists, and is in
the cubin nvcc builds of it (where nvcc is on PATH); every kernel the sources declare is in
the table; and nothing else in gpufio fetches a kernel by a string."""

import ast
import re
from pathlib import Path

import pytest

import gpufio
from gpufio.io import cuda
from gpufio.io.kernels import Kernel
from tests.io.test_kernel_sources import NVCC, _compile, _entry_points

MODULES = sorted({k.value.module for k in Kernel})


def _signature(text: str, entry: str) -> str:
    """The parameter list of ``entry``'s declaration in ``text``."""
    found = re.search(r'extern "C" __global__ void ' + entry + r"\(([^)]*)\)", text)
    assert found, f'{entry}: no extern "C" __global__ declaration'
    return found.group(1)


@pytest.mark.parametrize("kernel", list(Kernel), ids=[k.name for k in Kernel])
def test_the_entry_is_declared_in_its_source_taking_its_descriptors(kernel):
    source = cuda.KERNELS / f"{kernel.value.module}.cu"
    params = _signature(source.read_text(), kernel.value.entry)
    assert [t for t in kernel.value.takes if not re.search(rf"\b{t}\s*\*", params)] == []


def test_every_declared_kernel_is_in_the_table():
    declared = {(p.stem, name) for p in cuda.KERNELS.glob("*.cu")
                for name in _entry_points(p.read_text())}
    assert declared == {(k.value.module, k.value.entry) for k in Kernel}


def test_an_entry_is_named_once():
    assert len({(k.value.module, k.value.entry) for k in Kernel}) == len(Kernel)


@pytest.mark.skipif(NVCC is None, reason="no nvcc on PATH")
@pytest.mark.parametrize("module", MODULES)
def test_the_cubin_holds_the_tables_entries(module, tmp_path):
    cubin = _compile(cuda.KERNELS / f"{module}.cu", tmp_path / "k.cubin")
    entries = [k.value.entry for k in Kernel if k.value.module == module]
    assert [e for e in entries if e.encode() + b"\0" not in cubin] == []


def test_no_module_fetches_a_kernel_by_a_string():
    """get_function and io/cuda.module take a name from the table (io/kernels.py), never a
    literal written where the kernel is used."""
    root = Path(gpufio.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if path == root / "io" / "kernels.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("get_function", "module") \
                    and (node.func.attr == "get_function"
                         or getattr(node.func.value, "id", "") == "cuda") \
                    and any(isinstance(a, ast.Constant) and isinstance(a.value, str)
                            for a in node.args):
                found.append(f"{path.relative_to(root)}:{node.lineno} {node.func.attr}")
    assert found == []
