"""bench.bam's arguments, on the CPU: --pack is --price's, 1 to 32 warps to a block."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("args", [["--pack", "4"], ["--price", "4,4", "--pack", "33"],
                                  ["--price", "4,4", "--pack", "0"]])
def test_pack_outside_price_or_its_range_is_one_line_and_exit_2(args):
    res = subprocess.run([sys.executable, "-m", "bench.bam", "--controller", "compiled",
                          *args], capture_output=True, text=True)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"bench: --pack {args[-1]}: 1 to 32 warps to a block, with --price"]
