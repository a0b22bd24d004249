"""gpufio.gpu, the public module kernel authors import (docs/design/GPU-REQUEST-API.md):
it offers what that page uses, each name the thing it stands for, and the page sends no
one to gpufio's internals."""

from __future__ import annotations

import re

from gpufio import gpu
from gpufio.io import cuda
from gpufio.io.watchdog import Stalled

from checkout import REPO

DOC = REPO / "docs" / "design" / "GPU-REQUEST-API.md"


def test_every_exported_name_exists():
    assert sorted(gpu.__all__) == sorted(set(gpu.__all__))
    missing = [name for name in gpu.__all__ if not hasattr(gpu, name)]
    assert missing == []


def test_the_queues_are_request_queues_of_one_api():
    assert issubclass(gpu.UringQueue, gpu.RequestQueue)
    assert issubclass(gpu.NvmeQueues, gpu.RequestQueue)
    assert issubclass(gpu.QueueStalled, Stalled)
    for method in ("start", "wait", "abort", "close"):
        assert callable(getattr(gpu.RequestQueue, method))
    assert gpu.ring_sizes(16, None) == (16, 32)  # the CQ holds every read that can be in flight


def test_the_headers_declare_the_calls_the_page_documents():
    """Each device call in the page's tables is defined in the header it names."""
    assert gpu.HEADER.parent == gpu.KERNELS == cuda.KERNELS
    text = DOC.read_text()
    for header, section in ((gpu.HEADER, "Device side"), (gpu.CACHE_HEADER, "A GPU cache")):
        part = text[text.index(f"## {section}"):]
        part = part[:part.index("\n## ", 1)]
        calls = set(re.findall(r"^\| `[^`]*?\b(\w+)\(", part, re.M))
        assert calls, section
        source = header.read_text()
        absent = [c for c in calls if not re.search(rf"\b{c}\s*\(", source)]
        assert absent == [], (header.name, absent)


def test_compiling_uses_the_contract_and_the_include_path():
    assert gpu.compile_kernel is cuda.raw_module
    assert gpu.contract.STRUCTS["GioQueue"][:2] == ("nrings", "depth")
    assert any("C_REQUESTERS=" in d for d in gpu.contract.defines())


def test_the_page_imports_only_the_public_module():
    code = "\n".join(re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S))
    assert "from gpufio import gpu" in code
    assert re.findall(r"gpufio\.(?:io|core|engines|run)\b", code) == []
