"""The NVMe rig's own checks (tests/rig.py): a busybox the guest cannot run is refused before a
boot, and a guest that does not boot skips every ``nvme`` test with its console's last lines,
never errors them."""

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import rig

TESTS = Path(__file__).resolve().parent


def _elf(path: Path, interp: bytes | None) -> Path:
    """A minimal 64-bit little-endian ELF file: one PT_LOAD, and a PT_INTERP naming
    ``interp`` where given (what a dynamically linked executable carries)."""
    phdrs = [struct.pack("<IIQQQQQQ", 1, 5, 0, 0, 0, 0, 0, 0x1000)]
    tail = b""
    if interp is not None:
        at = 64 + 56 * 2
        phdrs.insert(0, struct.pack("<IIQQQQQQ", 3, 4, at, 0, 0, len(interp) + 1,
                                    len(interp) + 1, 1))
        tail = interp + b"\0"
    head = (b"\x7fELF\x02\x01\x01" + bytes(9)
            + struct.pack("<HHIQQQIHHHHHH", 2, 62, 1, 0, 64, 0, 0, 64, 56, len(phdrs),
                          64, 0, 0))
    path.write_bytes(head + b"".join(phdrs) + tail)
    path.chmod(0o755)
    return path


def test_a_static_busybox_passes_and_a_dynamic_one_is_refused_with_the_fix(tmp_path):
    static = _elf(tmp_path / "static", None)
    dynamic = _elf(tmp_path / "dynamic", b"/lib64/ld-linux-x86-64.so.2")
    assert rig.elf_interpreter(str(static)) is None
    assert rig.elf_interpreter(str(dynamic)) == "/lib64/ld-linux-x86-64.so.2"
    assert rig.busybox_problem(str(static)) is None
    assert rig.busybox_problem(str(dynamic)) == (
        f"{dynamic} is dynamically linked (loader /lib64/ld-linux-x86-64.so.2), the guest "
        "could not run /init (run rig/setup.sh as root: it installs busybox-static)")
    script = tmp_path / "script"
    script.write_text("#!/bin/sh\n")
    assert "is not a 64-bit little-endian ELF executable" in rig.busybox_problem(str(script))
    assert rig.busybox_problem(str(tmp_path / "none")).startswith(f"no busybox at {tmp_path}")


def test_the_rig_is_missing_while_its_busybox_is_dynamic(tmp_path, monkeypatch):
    dynamic = _elf(tmp_path / "busybox", b"/lib64/ld-linux-x86-64.so.2")
    monkeypatch.setattr(rig, "BUSYBOX", str(dynamic))
    monkeypatch.setattr(rig.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert rig.missing() == rig.busybox_problem(str(dynamic))


PLUGIN = """
import rig

rig.busybox_problem = lambda path: None  # past the check: the guest gets the dynamic one
"""


@pytest.mark.nvme
def test_a_guest_that_cannot_boot_skips_every_nvme_test_with_its_console(tmp_path):
    """A dynamically linked busybox in the initramfs (this interpreter stands in for Debian's
    busybox: it names its loader too) past the check: the kernel cannot run /init and
    panics; the run's nvme tests skip, the reason ending with the console's lines."""
    why = rig.missing()
    if why:
        pytest.skip(f"needs the NVMe rig: {why}")
    dynamic = os.path.realpath(sys.executable)
    if rig.elf_interpreter(dynamic) is None:
        pytest.skip(f"{dynamic} is statically linked: no dynamic executable to break the rig")
    (tmp_path / "broken_rig.py").write_text(PLUGIN)
    env = {**os.environ, "GPUFIO_RIG_BUSYBOX": dynamic,
           "PYTHONPATH": os.pathsep.join((str(tmp_path), str(TESTS)))}
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                          "-p", "broken_rig", "--basetemp", str(tmp_path / "run"),
                          str(TESTS / "io" / "nvme" / "test_nvme_rig.py")],
                         cwd=TESTS.parent, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "3 skipped" in res.stdout.splitlines()[-1], res.stdout
    reasons = [line for line in res.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(reasons) == 3 and all("the NVMe rig did not boot" in r for r in reasons)
    assert res.stdout.count("Failed to execute /init") == 3 and "Kernel panic" in res.stdout
    assert len(list((tmp_path / "run").glob("nvme-rig[0-9]*"))) == 1  # one boot tried, not three
