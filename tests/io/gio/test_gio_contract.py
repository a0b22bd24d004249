"""The host/kernel contract (io/gio/contract.py) against the CUDA sources, on the CPU: every
descriptor's field list is its C struct, field for field; the enums take their members only
from the contract's macros; and a kernel compiled without them says how to compile it (that
every kernel compiles with them: tests/io/test_kernel_sources.py)."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from gpufio.io import cuda
from gpufio.io.gio import contract

SOURCES = {p.name: p.read_text() for p in cuda.KERNELS.iterdir()}


def _struct_fields(name: str) -> list[str]:
    """Field names of ``struct name`` in the kernels, comments dropped, in order."""
    text = next(t for t in SOURCES.values() if f"struct {name} {{" in t)
    body = text.split(f"struct {name} {{", 1)[1].split("};", 1)[0]
    body = re.sub(r"//[^\n]*", "", body)
    names = []
    for decl in body.split(";"):
        decl = decl.strip()
        if decl:
            # "u64 a, b, c" or "int* state" or "u64 sqes, sq_head, ..."
            parts = [p.strip() for p in decl.split(",")]
            names.append(re.findall(r"\w+$", parts[0])[0])
            names += [re.findall(r"\w+$", p)[0] for p in parts[1:]]
    return names


@pytest.mark.parametrize("name", sorted(contract.STRUCTS))
def test_every_descriptor_is_its_c_struct_field_for_field(name):
    assert _struct_fields(name) == list(contract.STRUCTS[name])


def test_the_kernels_define_no_shared_constant_of_their_own():
    for fname, text in SOURCES.items():
        for const in contract.CONSTANTS:
            assert not re.search(rf"#define {const}\b", text), (fname, const)
    queue = SOURCES["gio_queue.cuh"]
    assert "enum Control { GIO_CONTROL_WORDS };" in queue
    assert "enum SlotState { GIO_SLOT_STATES };" in queue
    assert "enum BenchFlags { GIO_BENCH_FLAGS };" in queue


def test_build_fills_a_descriptor_by_name_and_refuses_gaps():
    values = {f: i for i, f in enumerate(contract.GIO_CACHE)}
    assert contract.build(contract.GIO_CACHE, values).tolist() == list(range(7))
    assert contract.build(contract.GIO_CACHE, values).dtype == np.uint64
    with pytest.raises(ValueError, match=r"missing \['hand'\], unknown \['hnad'\]"):
        contract.build(contract.GIO_CACHE, {**{k: 0 for k in contract.GIO_CACHE[:-1]},
                                            "hnad": 0})


def test_the_host_takes_its_words_and_states_from_the_contract():
    from gpufio.io.gio import queue

    assert [queue.C_STOP, queue.C_ABORT, queue.C_MEASURING, queue.C_REQUESTERS,
            queue.C_AGENTS, queue.C_GEN, queue.C_BAD_SLOT] == list(range(len(contract.CONTROL)))
    assert queue.SLOT_STATES == ("free", "claimed", "ready", "submitted", "done")
    assert len(contract.CONTROL) <= contract.CONTROL_WORDS


@pytest.mark.skipif(not shutil.which("nvcc"), reason="nvcc not installed")
def test_a_kernel_compiled_without_the_macros_says_how_to_compile_it(tmp_path):
    res = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-std=c++17", f"-I{cuda.KERNELS}",
                          str(cuda.KERNELS / "gio_agent.cu"), "-o", str(tmp_path / "k.cubin")],
                         capture_output=True, text=True)
    assert res.returncode != 0 and "compile through gpufio.io.cuda" in res.stderr


def test_the_gpu_price_counts_agent_warps_requester_blocks_and_sms():
    from gpufio.io.gio.bench import TPB, gpu_price

    p = gpu_price(rings=8, requesters=8 * 128, sms=132)
    assert p == {"agent_warps": 8, "requester_threads": 1024, "requester_warps": 32,
                 "blocks": 8 + 1024 // TPB, "sms": 132, "sms_occupied": 8 + 1024 // TPB}
    assert gpu_price(rings=16, requesters=1 << 16, sms=132)["sms_occupied"] == 132


@pytest.mark.parametrize("nrings,per_block,want", [
    (8, 1, ((8,), (32,))), (5, 2, ((3,), (64,))), (3, 8, ((1,), (96,))),
    (64, 32, ((2,), (1024,))), (70, 99, ((3,), (1024,)))])
def test_agent_warps_are_packed_to_blocks_of_at_most_a_thousand_threads(nrings, per_block,
                                                                       want):
    """A warp per ring, warps_per_block to a block (never more than the rings or 32):
    the kernel's agent_ring() counts warps across blocks in this order."""
    from gpufio.io.gio.queue import RequestQueue

    q = object.__new__(RequestQueue)
    q.nrings, q.warps_per_block = nrings, per_block
    assert q.agent_grid() == want
    # a kernel whose registers allow fewer threads to a block gets smaller blocks
    q._agent = type("Fn", (), {"max_threads_per_block": 256})()
    w = min(per_block, nrings, 8)
    assert q.agent_grid() == ((-(-nrings // w),), (32 * w,))
