"""gpufio on NVMe, in the rig's guest (tests/rig.py), as a user runs it: info and result
documents carrying the NVMe facts, the shipped drive profiles, compare's header, the write
guard on namespaces (real partition tables and filesystems, a multipath head), O_DIRECT
alignment from the namespace and doctor's NVMe checks.

Every gpufio command runs in one batch (``nvme_rig.gpufio``), forked from the guest's warm
interpreter: starting Python under TCG costs more than the commands."""

import json
import re
from pathlib import Path

import pytest

from rig import without

pytestmark = pytest.mark.nvme

WRITE = """[global]
engine = "uring"
rw = "write"
bs = "4k"
size = "1m"
verify = true

[[job]]
name = "w"
targets = ["{target}"]
write_device = "{device}"
"""
SHORT = ["--set", "runtime=1s", "--set", "ramp_time=0s", "--set", "size=256m", "-q",
         "--format", "json"]


@pytest.fixture(scope="module")
def nvme(nvme_rig, tmp_path_factory):
    """Lay out the namespaces (a GPT on one, ext4 on another), then run every command of this
    module in one guest interpreter."""
    why = without("sfdisk", "mkfs.ext4", "wipefs")
    if why:
        pytest.skip(why)
    d = tmp_path_factory.mktemp("nvme")
    gen4, gen5 = nvme_rig.namespace("rig-gen4", 1), nvme_rig.namespace("rig-gen5", 1)
    k4, mp1, mp2 = (nvme_rig.namespace("rig-4k", 1), nvme_rig.namespace("rig-mp", 1),
                    nvme_rig.namespace("rig-mp", 2))
    prep = nvme_rig.run(f"printf 'label: gpt\\n' | sfdisk -q {mp2} && mkfs.ext4 -q -F {k4}")
    assert prep.returncode == 0, prep.stderr
    profiles = {}
    for name, target, device in (("gpt", mp2, mp2), ("fs", k4, k4), ("other", mp1, gen4),
                                 ("head", mp1, mp1)):
        profiles[name] = d / f"{name}.toml"
        profiles[name].write_text(WRITE.format(target=target, device=device))
    out = {n: str(d / f"{n}.json") for n in ("pair", "qd", "rr")}
    argvs = {
        "info": ["info", "--target", gen4, "--target", mp1, "--target", k4, "--format", "json"],
        "pair": ["run", "profiles/gen4-vs-gen5.toml", *SHORT, "--output", out["pair"]],
        "compare": ["compare", out["pair"], out["pair"], "--format", "markdown"],
        "qd": ["run", "profiles/qd-sweep.toml", "--set", f"targets={json.dumps(gen4)}", *SHORT,
               "--output", out["qd"]],
        "rr": ["run", "profiles/randread-4k.toml", "--set", f"targets={json.dumps(gen5)}",
               *SHORT, "--output", out["rr"]],
        "align": ["run", "profiles/randread-4k.toml", "--set", f"targets={json.dumps(k4)}",
                  "--set", 'bs="512"', *SHORT],
        **{f"write-{n}": ["run", str(p), "-q", "--format", "json"] for n, p in profiles.items()},
        "doctor": ["doctor", "--target", gen4, "--target", mp1, "--format", "json"],
    }
    try:
        results = dict(zip(argvs, nvme_rig.gpufio(*argvs.values())))
    finally:  # the guest serves the whole run: later tests write to these namespaces
        wipe = nvme_rig.run(f"wipefs -q -a {mp2} {k4}")
        assert wipe.returncode == 0, wipe.stderr
    docs = {n: json.loads(Path(p).read_text()) for n, p in out.items() if Path(p).exists()}
    return {"results": results, "docs": docs, "gen4": gen4, "gen5": gen5, "k4": k4,
            "mp1": mp1, "mp2": mp2}


def ok(nvme, name):
    res = nvme["results"][name]
    assert res.returncode == 0, (res.stdout[-2000:], res.stderr[-2000:])
    return res


def test_info_carries_the_nvme_facts(nvme):
    targets = json.loads(ok(nvme, "info").stdout)["targets"]
    gen4, head, k4 = (targets[nvme[k]] for k in ("gen4", "mp1", "k4"))
    assert (gen4["model"], gen4["serial"], gen4["nsid"], gen4["logical_block_size"]) == (
        "QEMU NVMe Ctrl", "rig-gen4", 1, 512)
    assert re.fullmatch(r"\d+\.\d+\.\d+", gen4["firmware"])  # QEMU's version
    # QEMU 7.2's controller reports 2.5 GT/s x1 behind any port; the port reads as asked
    assert gen4["current_pcie_gen"] >= 1 and gen4["slot_max_pcie_gen"] >= 4
    assert gen4["slot_max_link_width"] == "4" and gen4["numa_node"] == "-1"
    assert gen4["io_queues"] >= 2 and gen4["poll_queues"] is True
    assert gen4["generic_device"] == "ng" + nvme["gen4"].removeprefix("/dev/nvme")
    assert k4["logical_block_size"] == 4096 and k4["poll_queues"] is False
    mp = head["multipath"]
    assert mp["head"] == nvme["mp1"].removeprefix("/dev/") and len(mp["paths"]) == 2
    assert {p["serial"] for p in mp["paths"]} == {"rig-mp"} and head["serial"] == "rig-mp"
    assert len({p["controller"] for p in mp["paths"]}) == 2
    assert all("current_pcie_gen" in p for p in mp["paths"]) and "current_pcie_gen" in head


def test_gen4_vs_gen5_as_shipped_and_compare_shows_each_link(nvme):
    ok(nvme, "pair")
    jobs = {j["jobname"]: j for j in nvme["docs"]["pair"]["jobs"]}
    assert [t["serial"] for t in jobs["gen4"]["targets"]] == ["rig-gen4"]
    assert [t["serial"] for t in jobs["gen5"]["targets"]] == ["rig-gen5"]
    assert all(j["read"]["total_ios"] > 0 for j in jobs.values())
    header = ok(nvme, "compare").stdout.splitlines()[0]
    for dev in (nvme["gen4"], nvme["gen5"]):
        assert re.search(re.escape(dev) + r" \(QEMU NVMe Ctrl Gen\dx\d+\)", header), header


def test_qd_sweep_and_randread_on_a_namespace(nvme):
    ok(nvme, "qd"), ok(nvme, "rr")
    qd = nvme["docs"]["qd"]["jobs"]
    assert len(qd) == 5 and all(j["read"]["total_ios"] > 0 for j in qd)
    assert {t["path"] for j in qd for t in j["targets"]} == {nvme["gen4"]}
    (rr,) = nvme["docs"]["rr"]["jobs"]
    assert rr["read"]["total_ios"] > 0 and rr["targets"][0]["serial"] == "rig-gen5"


def test_bs_below_the_namespace_lba_is_one_line(nvme):
    res = nvme["results"]["align"]
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert nvme["k4"] in res.stderr and "bs 512" in res.stderr and "4096" in res.stderr


def test_write_guard_on_namespaces(nvme):
    gpt, fs, other = (nvme["results"][f"write-{n}"] for n in ("gpt", "fs", "other"))
    assert gpt.returncode == 2 and "partition table" in gpt.stderr
    assert fs.returncode == 2 and "filesystem" in fs.stderr
    assert other.returncode == 2 and "confirm with write_device" in other.stderr
    # a multipath head: its paths (hidden disks, no device node) are checked with it
    (job,) = json.loads(ok(nvme, "write-head").stdout)["jobs"]
    assert job["write"]["total_ios"] == 256 and job["verify"]["failures"] == 0


def test_doctor_on_nvme(nvme):
    res = nvme["results"]["doctor"]
    assert res.returncode in (0, 1), res.stderr
    checks = {(c["area"], c["name"]): c for c in json.loads(res.stdout)["checks"]}
    gen4, head = f"target {nvme['gen4']}", f"target {nvme['mp1']}"
    assert checks[(gen4, "NVMe multipath")]["found"] == "nvme_core multipath=Y"
    assert "head" in checks[(head, "NVMe multipath")]["found"]
    assert checks[(gen4, "NVMe poll queues")]["status"] == "ok"
    assert checks[(head, "NVMe poll queues")]["status"] == "warn"
    assert checks[(gen4, "IOMMU group")]["found"].startswith("group ")
    assert checks[(gen4, "I/O scheduler")]["status"] == "ok"
    assert "nr_requests" in checks[(gen4, "queue depth limit")]["found"]
