"""uring-cmd against emulated NVMe namespaces in the QEMU rig (the ``nvme_rig`` fixture,
tests/rig.py): verified reads from a 512-byte and a 4096-byte LBA namespace after writes
behind the write guard, the bad inputs as one line with exit 2, a status from the drive
named, fio's io_uring_cmd job files, and doctor's passthrough lines. Under TCG every Python
start is slow, so one batch (forked from the guest's warm interpreter) runs every case, and
each test reads its own. The jobs that neither verify nor sync run through the compiled
loop (io/loops.c over the passthrough ring), whose IOPS x mean latency is held to the depth."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from rig import Py, Sh, without

pytestmark = pytest.mark.nvme

ENGINE = "uring-cmd"
WRITE = ('[global]\nengine = "uring-cmd"\niodepth = 8\nrw = "write"\nbs = "64k"\n'
         'size = "4m"\n[[job]]\nname = "lay"\n')
READ = ('[global]\nengine = "uring-cmd"\niodepth = 8\nrw = "randread"\nbs = "4k"\n'
        'size = "4m"\nio_size = "1m"\nverify = true\n[[job]]\nname = "rd"\n')
# Little's law through the compiled loop: 8 reads in flight, timed as fio's lat
LITTLE = ('[global]\nengine = "uring-cmd"\niodepth = 8\nrw = "randread"\nbs = "4k"\n'
          'size = "4m"\nruntime = "2s"\ntime_based = true\n[[job]]\nname = "little"\n')
FIO = "[rd]\nioengine=io_uring_cmd\ncmd_type=nvme\nfilename={ng}\nrw=randread\nbs=4k\n" \
      "iodepth=4\nsize=4m\nio_size=256k\n"
# one read past the namespace's last block, built and sent by hand: the drive's own status
PAST_END = r"""
import os, sys, numpy as np
from gpufio.facts import nvme_generic
from gpufio.io import uring
from gpufio.io.nvme import passthru, spec
ng = sys.argv[1]
ns = nvme_generic.lookup(ng)
fd = os.open(ng, os.O_RDONLY)
buf = np.zeros(ns.lba_bytes, np.uint8)
with uring.Ring(2, big=True) as r:
    r.push(passthru.build(write=False, fd=fd, nsid=nvme_generic.namespace_id(fd),
                          lba_shift=ns.lba_bytes.bit_length() - 1,
                          off=np.array([ns.size], np.uint64), length=ns.lba_bytes,
                          addr=np.array([buf.ctypes.data], np.uint64),
                          user_data=np.array([1], np.uint64)))
    r.submit(wait=1, timeout_ns=30_000_000_000)
    ud, res = r.reap()
print("STATUS", int(res[0]), spec.error_name(-int(passthru.result(res, ns.lba_bytes)[0])))
"""


@pytest.fixture(scope="module")
def rig(request):
    try:
        return request.getfixturevalue("nvme_rig")
    except pytest.FixtureLookupError:
        pytest.skip("no nvme_rig fixture in this tree (tests/conftest.py, the rig's branch)")


def _steps(rig, d: Path) -> dict[str, list]:
    """Each case's steps (``rig.batch``), with its files written into ``d``."""
    ng512, blk512 = rig.generic("rig-gen4", 1), rig.namespace("rig-gen4", 1)
    ng4k, blk4k = rig.generic("rig-4k", 1), rig.namespace("rig-4k", 1)
    ngmp, blkmp = rig.generic("rig-mp", 2), rig.namespace("rig-mp", 2)
    for name, text in {"w.toml": WRITE, "r.toml": READ, "r.fio": FIO.format(ng=ng512),
                       "past_end.py": PAST_END, "little.toml": LITTLE}.items():
        (d / name).write_text(text)
    w, r = ["run", str(d / "w.toml"), "-q"], ["run", str(d / "r.toml"), "-q"]
    return {
        "write512": [[*w, "-f", "json", "-s", f"targets={ng512}", "-s", f"write_device={ng512}"]],
        "read512": [[*r, "-f", "json", "-s", f"targets={blk512}"]],
        "little": [["run", str(d / "little.toml"), "-q", "-f", "json", "-s", f"targets={ng512}"]],
        "write4k": [[*w, "-f", "json", "-s", f"targets={blk4k}", "-s", f"write_device={blk4k}"]],
        "read4k": [[*r, "-f", "json", "-s", f"targets={ng4k}"]],
        "no_consent": [[*w, "-s", f"targets={ng512}"]],
        # a real GPT (libblkid checks its header's checksum), wiped afterwards: the guest
        # serves the whole run
        "signature": [Sh(f"printf 'label: gpt\\n' | sfdisk -q {blkmp}"),
                      [*w, "-s", f"targets={ngmp}", "-s", f"write_device={ngmp}"],
                      Sh(f"wipefs -q -a {blkmp}")],
        "bs512_on_4k": [[*r, "-s", f"targets={ng4k}", "-s", "bs=512"]],
        "not_nvme": [[*r, "-s", "targets=/dev/null"]],
        "generic_elsewhere": [[*r, "-s", f"targets={ng512}", "-s", "engine=uring",
                               "-s", "verify=false"]],
        "hipri": [Sh(f"cat /sys/block/{blk512.rsplit('/', 1)[1]}/queue/io_poll"),
                  [*r, "-f", "json", "-s", f"targets={ng512}", "-s", "hipri=true"]],
        "past_end": [Py(str(d / "past_end.py"), (ng512,))],
        "fio_file": [["run", str(d / "r.fio"), "-q", "-f", "json"]],
        "doctor": [["doctor", "-f", "json"]],
    }


@pytest.fixture(scope="module")
def out(rig, tmp_path_factory) -> dict[str, list[subprocess.CompletedProcess[str]]]:
    """Every case's steps' outcomes, from one batch in the guest."""
    cases = _steps(rig, tmp_path_factory.mktemp("uring-cmd"))
    done = iter(rig.batch(*(s for steps in cases.values() for s in steps), timeout=1500))
    return {name: [next(done) for _ in steps] for name, steps in cases.items()}


def _doc(res: subprocess.CompletedProcess[str], ok: tuple[int, ...] = (0,)) -> dict:
    assert res.returncode in ok, res.stdout + res.stderr
    return json.loads(res.stdout)


def _one_line(out, name: str, step: int = 0) -> str:
    res = out[name][step]
    text = res.stdout + res.stderr
    lines = text.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


@pytest.mark.parametrize("lba", ["512", "4k"])
def test_writes_then_verified_reads_on_each_namespace(out, lba):
    (w,) = _doc(out[f"write{lba}"][0])["jobs"]
    assert w["engine"] == ENGINE and w["error"] == 0 and w["write"]["io_bytes"] == 4 << 20
    (r,) = _doc(out[f"read{lba}"][0])["jobs"]
    assert r["error"] == 0 and not r["errors"] and r["verify"]["failures"] == 0
    # the bytes the compiled loop wrote, checked by the Python loop's verifying reads (the
    # compiled loops leave verify to it: engines/base.compiled_loop)
    assert w["engine_facts"]["loop"] == "compiled" and r["engine_facts"]["loop"] == "python"
    assert r["read"]["io_bytes"] == 1 << 20 and r["verify"]["enabled"]
    t = r["targets"][0]
    assert t["lba_bytes"] == (512 if lba == "512" else 4096) and t["nsid"] == 1
    assert t["generic_device"].startswith("/dev/ng") and t["namespace"].startswith("/dev/nvme")


def test_the_compiled_loop_keeps_its_depth_by_littles_law(out):
    # IOPS x mean latency is the 8 reads in flight, as tests/loops/test_littles_law.py holds
    # uring's: the compiled loop stamps each I/O when it takes it and just after the call
    # that reaped it, as fio's lat. Under TCG it came to 7.73-7.75 (three runs), the
    # Python loop's to 6.97-7.30
    (r,) = _doc(out["little"][0])["jobs"]
    assert r["engine_facts"]["loop"] == "compiled" and r["error"] == 0 and not r["errors"]
    product = r["read"]["iops"] * r["read"]["lat_ns"]["mean"] / 1e9
    assert abs(product - 8) <= 0.05 * 8, (
        f"IOPS x mean latency = {product:.2f}, depth 8: {r['read']['total_ios']} reads at "
        f"{r['read']['lat_ns']['mean'] / 1e3:.1f} us")


def test_writes_need_the_guards_consent(out):
    assert "confirm with write_device" in _one_line(out, "no_consent")
    why = without("sfdisk", "wipefs")
    if why:
        pytest.skip(f"the partition table's case: {why}")
    gpt, _, wipe = out["signature"]
    assert gpt.returncode == 0 and wipe.returncode == 0, gpt.stderr + wipe.stderr
    assert 'holds a partition table (PTTYPE="gpt")' in _one_line(out, "signature", 1)


def test_bad_inputs_are_one_line(out):
    assert "bs 512 is not a multiple of its namespace's logical block size 4096" in \
        _one_line(out, "bs512_on_4k")
    assert "target /dev/null: is not an NVMe namespace" in _one_line(out, "not_nvme")
    assert "is an NVMe generic char device" in _one_line(out, "generic_elsewhere")


def test_hipri_polls_where_there_are_poll_queues_and_is_refused_elsewhere(out):
    poll, res = out["hipri"]
    if poll.stdout.strip() == "1":
        (r,) = _doc(res)["jobs"]
        assert r["engine_facts"]["hipri"] and r["verify"]["failures"] == 0
    else:
        assert res.returncode == 2 and "hipri needs poll queues" in res.stderr


def test_a_status_from_the_drive_is_one_failed_io_named(out):
    (res,) = out["past_end"]
    text = res.stdout + res.stderr
    assert res.returncode == 0, text
    assert re.search(r"STATUS \d+ NVMe status 0x080: generic, LBA out of range", text), text


def test_fio_io_uring_cmd_job_files_run(out):
    (r,) = _doc(out["fio_file"][0])["jobs"]
    assert r["engine"] == ENGINE and r["error"] == 0 and r["read"]["io_bytes"] == 256 << 10


def test_doctor_says_passthrough_can_run(out):
    checks = {c["name"]: c for c in _doc(out["doctor"][0], ok=(0, 1))["checks"] if c["area"] == ENGINE}
    assert checks["passthrough kernel"]["status"] == "ok"
    assert checks["generic devices"]["status"] == "ok" and "/dev/ng" in \
        checks["generic devices"]["found"]
    assert checks["passthrough permission"]["status"] == "ok"
