"""NVMe Flush from the bam engine's CPU stand-in in the NVMe rig (QEMU's emulated controller,
the emulated IOMMU on): fsync = N sends a Flush after every N writes once they landed,
end_fsync one more when the writes are done, each counted as fio counts an fsync, none
left to the runner (the controller's namespace has no file while gpufio holds it); the
writes read back verified through bam. One gpufio batch in the guest."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.nvme


def test_fsync_and_end_fsync_send_nvme_flushes(nvme_rig, tmp_path) -> None:
    ns = nvme_rig.namespace("rig-4k", 1)
    assert nvme_rig.run("modprobe vfio-pci").returncode == 0
    profile = tmp_path / "flush.toml"
    job = {"name": "flush", "engine": "bam", "targets": [ns], "size": "16m",
           "rw": "randwrite", "bs": "8k", "iodepth": 8, "io_size": "1m", "fsync": 16,
           "end_fsync": True, "verify": True, "write_device": ns}
    profile.write_text("[[job]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in job.items()))
    (res,) = nvme_rig.gpufio(["run", "-q", "-f", "json", str(profile)], timeout=900)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)["jobs"][0]
    assert out["error"] == 0 and not out["failure"] and out["verify"]["failures"] == 0
    assert all(p["ok"] for p in out["phases"])  # the read-back through bam
    assert out["write"]["total_ios"] == 128
    # 128 writes: a Flush after each 16 (8), and end_fsync's (1); the runner adds none
    assert out["sync"]["total_ios"] == 9
    assert out["engine_facts"]["submitter"] == "cpu-stand-in"
