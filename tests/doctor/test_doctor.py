"""gpufio doctor on fake /proc, /sys, /boot and /etc trees: every check both ways, the mode
cuFile will take and why, and the command's exit code and JSON."""

import gzip
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufio.cli import app
from gpufio.core.job import Job
from gpufio.engines import all_engines
from gpufio.engines.cufile import GDS_FILESYSTEMS
from gpufio.facts.device import path_facts
from gpufio.facts.system import Host, cufile_setting, pci_relation, strip_comments
from gpufio.profile import from_dict
from gpufio.doctor import gpu_checks, link_check, target_checks

cli = CliRunner()


def tree(root: Path, files: dict[str, str]) -> Host:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return Host(str(root), env={"CUFILE_ENV_PATH_JSON": "/etc/cufile.json"})


def checks(host: Host, engine: str, jobs: list[Job] = ()) -> dict[str, object]:
    return {c.name: c for c in all_engines()[engine].doctor(host, list(jobs))}


GDS = {"proc/sys/kernel/osrelease": "6.8.0-50-generic",
       "proc/modules": "nvidia_fs 270336 0 - Live 0x0\nnvidia 1 2 - Live 0x0\n",
       "proc/driver/nvidia-fs/version": "version: 2.24.3",
       "proc/driver/nvidia/version": "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15",
       "proc/cmdline": "ro quiet iommu=pt",
       "etc/cufile.json": '{ // cuFile settings\n "properties": {"io_batchsize": 128,\n'
                          ' "use_poll_mode": false, "url": "http://x//y",\n'
                          ' "posix_pool_slab_size_kb": [4, 1024], "posix_pool_slab_count": [128, 64]}}'}
P2P = {"proc/sys/kernel/osrelease": "6.11.0",
       "boot/config-6.11.0": "CONFIG_A=y\nCONFIG_PCI_P2PDMA=y\n",
       "proc/driver/nvidia/version": "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  "
                                     "570.86.15  Release Build",
       "sys/module/nvidia/parameters/NVreg_RegistryDwords": "RMForceStaticBar1=1",
       "sys/module/nvme_core/parameters/multipath": "N",
       "etc/cufile.json": '{"properties": {"use_pci_p2pdma": true}}'}


def test_host_readings(tmp_path):
    host = tree(tmp_path, {**P2P, "sys/devices/system/cpu/online": "0-15,32-47",
                           "proc/sys/kernel/io_uring_disabled": "1"})
    assert host.kernel_version() == (6, 11) and host.kernel_config("CONFIG_PCI_P2PDMA") == "y"
    assert host.kernel_config("CONFIG_MISSING") is None
    assert host.nvidia_driver() == ("570.86.15", True) and host.nvidia_fs_version() is None
    assert host.cpus() == 32 and host.io_uring_disabled() == 1
    (tmp_path / "boot/config-6.11.0").unlink()
    (tmp_path / "proc/config.gz").write_bytes(gzip.compress(b"CONFIG_PCI_P2PDMA=m\n"))
    assert host.kernel_config("CONFIG_PCI_P2PDMA") == "m"
    assert json.loads(strip_comments('{"a": "//kept" // gone\n}')) == {"a": "//kept"}
    gds = tree(tmp_path / "g", GDS)
    assert gds.nvidia_fs_version() == "2.24.3" and gds.nvidia_driver() == ("550.54.15", False)
    path, settings, error = gds.cufile_json()
    assert error is None and cufile_setting(settings, "properties.io_batchsize") == 128
    assert cufile_setting(settings, "properties.url") == "http://x//y"


def test_cufile_mode_gds_through_nvidia_fs(tmp_path):
    c = checks(tree(tmp_path, GDS), "cufile")
    assert c["nvidia-fs (GDS driver)"].status == "ok" and "2.24.3" in c["nvidia-fs (GDS driver)"].found
    assert c["mode cuFile will take"].status == "ok"
    assert c["mode cuFile will take"].found == "gds (nvidia-fs)"
    assert "io_batchsize=128" in c["cufile.json"].found
    assert ("posix_pool_slab_size_kb=[4, 1024], posix_pool_slab_count=[128, 64]"
            in c["cufile.json"].found)
    assert c["open driver >= 565"].status == "warn"  # P2PDMA's prerequisites are still listed


def test_cufile_mode_gds_through_p2pdma(tmp_path):
    c = checks(tree(tmp_path, P2P), "cufile")
    assert c["nvidia-fs (GDS driver)"].status == "warn"
    assert all(c[k].status == "ok" for k in ("kernel >= 6.2", "CONFIG_PCI_P2PDMA",
                                             "open driver >= 565", "RMForceStaticBar1",
                                             "nvme_core multipath=N"))
    assert c["mode cuFile will take"].found == "gds (P2PDMA)"


def test_cufile_compat_with_every_reason_and_fix(tmp_path):
    host = tree(tmp_path, {"proc/sys/kernel/osrelease": "5.15.0", "proc/cmdline": "ro",
                           "sys/kernel/iommu_groups/0/x": "", "sys/kernel/iommu_groups/1/x": ""})
    c = checks(host, "cufile")
    mode = c["mode cuFile will take"]
    assert mode.status == "warn" and mode.found.startswith("compat") and "bounce" in mode.fix
    assert c["kernel >= 6.2"].status == "warn" and c["open driver >= 565"].found == "no NVIDIA driver"
    assert c["IOMMU"].status == "warn" and "iommu=pt" in c["IOMMU"].fix
    assert c["cufile.json"].status == "warn" and "not found" in c["cufile.json"].found
    assert all(ch.fix for ch in c.values() if ch.status != "ok")


def test_cufile_checks_each_targets_filesystem(tmp_path):
    target = tmp_path / "f.dat"
    target.write_bytes(b"x" * 4096)
    job = from_dict({"global": {"engine": "cufile", "targets": [str(target), "/dev/shm"]}},
                    "p.toml", {}).jobs[0]
    c = checks(tree(tmp_path / "t", GDS), "cufile", [job])
    able = path_facts(str(target)).get("filesystem") in GDS_FILESYSTEMS  # ext4 on CI
    assert c[f"target {target}"].status == ("ok" if able else "warn")
    assert c["target /dev/shm"].status == "warn" and "tmpfs" in c["target /dev/shm"].found


def test_cufile_raw_apis_need_udevs_record_of_each_targets_device(tmp_path):
    target = tmp_path / "f.dat"
    target.write_bytes(b"x" * 4096)
    dev = os.stat(target).st_dev
    job = from_dict({"global": {"engine": "cufile", "api": "batch", "targets": [str(target)]}},
                    "p.toml", {}).jobs[0]
    name = f"udev record for {target}"
    missing = checks(tree(tmp_path / "a", GDS), "cufile", [job])[name]
    assert missing.status == "warn" and "none" in missing.found and "ID_FS_TYPE" in missing.fix
    rec = {f"run/udev/data/b{os.major(dev)}:{os.minor(dev)}":
           "E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4"}
    found = checks(tree(tmp_path / "b", {**GDS, **rec}), "cufile", [job])[name]
    assert found.status == "ok" and found.found.endswith("ID_FS_TYPE=ext4")
    kvikio = from_dict({"global": {"engine": "cufile", "targets": [str(target)]}},
                       "p.toml", {}).jobs[0]
    assert name not in checks(tree(tmp_path / "c", GDS), "cufile", [kvikio])


@pytest.mark.parametrize("disabled, status", [("0", "ok"), ("1", "warn"), ("2", "fail")])
def test_gpu_uring_io_uring_sysctl(tmp_path, disabled, status):
    host = tree(tmp_path, {"proc/sys/kernel/osrelease": "6.8.0",
                           "proc/sys/kernel/io_uring_disabled": disabled})
    assert checks(host, "gpu-uring")["io_uring enabled"].status == status


def test_gpu_uring_kernel_cores_and_environment(tmp_path):
    host = tree(tmp_path, {"proc/sys/kernel/osrelease": "6.5.7",
                           "sys/devices/system/cpu/online": "0-3"})
    host.env.update(CUDA_LAUNCH_BLOCKING="1", CUDA_MODULE_LOADING="LAZY")
    job = from_dict({"global": {"engine": "gpu-uring", "rings": 4, "sq_threads": 4}}, "p.toml",
                    {}).jobs[0]
    c = checks(host, "gpu-uring", [job])
    assert c["kernel >= 6.6"].status == "fail"
    serial = c["kernels run together"]
    assert serial.status == "fail" and "CUDA_LAUNCH_BLOCKING" in serial.found
    assert c["CUDA module loading"].status == "warn"
    cores = c["cores for job 'p'"]
    assert cores.status == "warn" and "4 SQPOLL threads on 4 CPUs" in cores.found
    good = tree(tmp_path / "g", {"proc/sys/kernel/osrelease": "6.8.0",
                                 "sys/devices/system/cpu/online": "0-15"})
    good.env.clear()
    g = checks(good, "gpu-uring", [job])
    assert all(ch.status == "ok" for ch in g.values()), g
    # a drive's rings share one SQPOLL thread unless sq_threads says otherwise
    one = from_dict({"global": {"engine": "gpu-uring", "rings": 4}}, "p.toml", {}).jobs[0]
    found = checks(host, "gpu-uring", [one])["cores for job 'p'"].found
    assert "1 SQPOLL threads on 4 CPUs" in found


def test_cpu_gpu_processes_need_mps(tmp_path):
    host = tree(tmp_path, {})
    host.env["CUDA_MPS_PIPE_DIRECTORY"] = "/run/mps"
    job = from_dict({"global": {"engine": "cpu-gpu", "processes": True}}, "p.toml", {}).jobs[0]
    assert checks(host, "cpu-gpu", [job])["MPS daemon"].status == "warn"
    (tmp_path / "run/mps").mkdir(parents=True)
    (tmp_path / "run/mps/control").write_text("")
    assert checks(host, "cpu-gpu", [job])["MPS daemon"].status == "ok"
    plain = from_dict({"global": {"engine": "cpu-gpu"}}, "p.toml", {}).jobs[0]
    assert checks(host, "cpu-gpu", [plain]) == {}


def test_pci_relations():
    root = Path("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0")
    assert pci_relation(root / "0000:02:00.0/0000:03:00.0", root / "0000:02:04.0/0000:04:00.0") \
        == "same PCIe switch"
    assert pci_relation(Path("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"),
                        Path("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.1")) == "same root port"
    assert pci_relation(Path("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"),
                        Path("/sys/devices/pci0000:00/0000:00:03.0/0000:05:00.0")) \
        == "same root complex, other root ports"
    assert pci_relation(Path("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"),
                        Path("/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0")) \
        == "across root complexes"


def test_gpu_links_from_the_device_tree(tmp_path):
    dev = "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"
    host = tree(tmp_path, {f"{dev}/current_link_speed": "16.0 GT/s PCIe",
                           f"{dev}/current_link_width": "8", f"{dev}/max_link_speed": "32.0 GT/s PCIe",
                           f"{dev}/max_link_width": "16", "proc/driver/nvidia/gpus/0000:01:00.0/x": ""})
    (tmp_path / "sys/bus/pci/devices").mkdir(parents=True)
    os.symlink(tmp_path / dev, tmp_path / "sys/bus/pci/devices/0000:01:00.0")
    found, places = gpu_checks(host)
    links = [c for c in found if c.name.endswith("PCIe link")]
    assert [c.status for c in links] == ["warn"] and "Gen4 x8 (can do Gen5 x16)" in links[0].found
    assert places == {"0000:01:00.0": (tmp_path / dev).resolve()}
    assert link_check("t", "l", {"current_pcie_gen": 5, "max_pcie_gen": 5,
                                 "current_link_width": "4", "max_link_width": "4"}).status == "ok"


def test_targets_drive_ram_missing(tmp_path):
    f = tmp_path / "t.dat"
    f.write_bytes(b"\0" * 4096)
    mine = {c.name: c for c in target_checks(str(f), 1, {})}
    assert mine["storage"].status == "ok" and mine["O_DIRECT alignment"].status == "ok"
    shm = {c.name: c for c in target_checks("/dev/shm", 1, {})}
    assert shm["storage"].status == "warn" and shm["storage"].found.startswith("tmpfs: ")
    (missing,) = target_checks(str(tmp_path / "nope"), 1, {})
    assert missing.status == "fail"


def test_a_target_without_a_profile_is_described_not_judged_by_jobs(tmp_path, monkeypatch):
    """``doctor --target X`` alone: no job keeps anything in flight, so the queue row speaks
    of the disk's limit; a profile's job on it is judged by its depth."""
    from gpufio import doctor

    disk = {"kind": "drive", "reaches_storage": True, "reason": "vdz", "backed": 1.0}
    monkeypatch.setattr(doctor, "path_facts", lambda path, **_: {"device": "vdz", "storage": disk})
    monkeypatch.setattr(doctor, "read_int", lambda path: 64 if path.endswith(
        "vdz/queue/nr_requests") else None)
    f = tmp_path / "t.dat"
    f.write_bytes(b"\0" * 4096)
    by = {c.name: c for c in doctor.diagnose([], [str(f)], Host(str(tmp_path / "root")))}
    row = by["queue depth limit"]
    assert row.status == "ok" and "in flight" not in row.found
    assert row.found.startswith("nr_requests 64: the block layer queues up to 64 requests for vdz")
    prof = from_dict({"global": {"targets": [str(f)], "iodepth": 128}}, "p.toml", {})
    by = {c.name: c for c in doctor.diagnose(prof.jobs, [], Host(str(tmp_path / "root")))
          if c.area == f"target {f}"}
    assert by["queue depth limit"].status == "warn"
    assert by["queue depth limit"].found == "nr_requests 64, jobs keep up to 128 in flight"


def test_a_target_on_any_pci_disk_is_placed_against_each_gpu(tmp_path, monkeypatch):
    """Not only NVMe: the root disk of the H200 machine is virtio, a PCI function too."""
    from gpufio import doctor

    root = Path("/sys/devices/pci0000:00")
    disk_fn, gpu = root / "0000:00:02.0", root / "0000:00:06.0"
    monkeypatch.setattr(doctor, "pci_device_of", lambda path: disk_fn)
    f = tmp_path / "t.dat"
    f.write_bytes(b"\0" * 4096)
    mine = {c.name: c for c in target_checks(str(f), 1, {"0000:00:06.0": gpu})}
    assert mine["PCIe path to GPU 0000:00:06.0"].found == (
        "same root complex, other root ports (the disk's PCI function 0000:00:02.0)")
    shm = {c.name for c in target_checks("/dev/shm", 1, {"0000:00:06.0": gpu})}
    assert "PCIe path to GPU 0000:00:06.0" not in shm  # RAM has no place in the tree


def test_doctor_command_json_and_exit_codes(tmp_path):
    f = tmp_path / "t.dat"
    f.write_bytes(b"\0" * 4096)
    res = cli.invoke(app, ["doctor", "-t", str(f), "-f", "json"])
    assert res.exit_code == 0, res.output
    found = json.loads(res.stdout)["checks"]
    areas = {c["area"] for c in found}
    assert {"cufile", "gpu-uring", f"target {f}"} <= areas
    assert all(c["status"] in ("ok", "warn", "fail") for c in found)
    res = cli.invoke(app, ["doctor", "-t", str(tmp_path / "missing"), "-f", "json"])
    assert res.exit_code == 1
    assert any(c["status"] == "fail" for c in json.loads(res.stdout)["checks"])
    res = cli.invoke(app, ["doctor", "-f", "yaml"])
    assert res.exit_code == 2 and "--format" in res.output


def _config_with_acs(control: int) -> bytes:
    """A 4 KiB config space with two extended capabilities, ACS the second."""
    cfg = bytearray(4096)
    cfg[0x100:0x104] = (0x0001 | (1 << 16) | (0x140 << 20)).to_bytes(4, "little")  # AER
    cfg[0x140:0x144] = (0x000D | (1 << 16) | (0 << 20)).to_bytes(4, "little")  # ACS, last
    cfg[0x146:0x148] = control.to_bytes(2, "little")
    return bytes(cfg)


def test_bar1_and_acs_of_the_bridges_above_a_gpu(tmp_path):
    bridge = tmp_path / "sys/devices/pci0000:00/0000:00:01.0"
    switch = bridge / "0000:01:00.0"
    gpu = switch / "0000:02:00.0"
    gpu.mkdir(parents=True)
    (gpu / "resource").write_text("0x00 0x0ffffff 0x0\n0x2000000000 0x3fffffffff 0x0\n")
    (bridge / "config").write_bytes(_config_with_acs(0x1D))  # redirects on
    (switch / "config").write_bytes(_config_with_acs(0x01))  # source validation only
    (tmp_path / "proc/driver/nvidia/gpus/0000:02:00.0").mkdir(parents=True)
    (tmp_path / "sys/bus/pci/devices").mkdir(parents=True)
    os.symlink(gpu, tmp_path / "sys/bus/pci/devices/0000:02:00.0")
    found, _ = gpu_checks(Host(str(tmp_path), env={}))
    by = {c.name: c for c in found}
    assert by["GPU 0000:02:00.0 BAR1"].found.startswith("128 GiB")
    acs = by["ACS above GPU 0000:02:00.0"]
    assert acs.status == "warn" and acs.found.startswith("0000:00:01.0: P2P request redirect")
    assert "0000:01:00.0" not in acs.found
    (bridge / "config").write_bytes(_config_with_acs(0x01))
    found, _ = gpu_checks(Host(str(tmp_path), env={}))
    assert {c.name: c for c in found}["ACS above GPU 0000:02:00.0"].status == "ok"


def test_gpu_facts_carry_local_cpus_bar1_and_the_path_to_each_nvme(tmp_path, monkeypatch):
    from gpufio.facts.system import pci_place_facts
    from gpufio.workloads.block import document

    root = tmp_path / "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"
    gpu, nvme = root / "0000:02:00.0", root / "0000:02:04.0" / "0000:04:00.0"
    for d in (gpu, nvme):
        d.mkdir(parents=True)
    (gpu / "local_cpulist").write_text("0-15\n")
    (gpu / "resource").write_text("0x0 0xffffff 0x0\n0x0 0x3ffffffff 0x0\n")
    assert pci_place_facts(gpu) == {"local_cpulist": "0-15", "bar1_bytes": 16 << 30}
    devices = tmp_path / "pci-devices"
    devices.mkdir()
    os.symlink(gpu, devices / "0000:02:00.0")
    monkeypatch.setattr(document, "pci_device_of", lambda path: nvme if path == "/a" else None)
    facts = document.topology({"pci_bus_id": "0000:02:00.0"},
                              {"nvme0n1": "/a", "vdb": "/b"}, devices)
    assert facts == {"pcie_path_to": {"nvme0n1": "same PCIe switch"}}
    assert document.topology({"pci_bus_id": "0000:09:00.0"}, {"nvme0n1": "/a"}, devices) == {}


def test_a_host_without_a_gpu_says_so_and_gives_no_gpu_driver_advice(tmp_path):
    from gpufio import doctor

    host = tree(tmp_path, {"proc/sys/kernel/osrelease": "6.8.0", "proc/modules": ""})
    assert doctor.headline(host) == doctor.NO_GPU
    found = doctor.diagnose([], [], host)
    assert not [c for c in found if "NVreg" in c.fix or "nvidia-fs" in c.fix or "modprobe" in c.fix]
    gpu_engines = [n for n, cls in all_engines().items() if cls.uses_gpu]
    rows = {c.area: c for c in found if c.name == "GPU"}
    assert sorted(rows) == sorted(gpu_engines)
    assert all(c.status == "warn" and c.found.startswith("none on this host")
               for c in rows.values())
    assert "rows and tensors in host memory" in rows["mmap"].found
    # an NVIDIA card on the bus, driver or not: the GPU checks are back
    dev = tmp_path / "sys/bus/pci/devices/0000:65:00.0"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x10de\n")
    (dev / "class").write_text("0x030200\n")
    assert host.has_gpu() and doctor.headline(host) == ""
    assert "RMForceStaticBar1" in checks(host, "cufile")
    assert not [c for c in doctor.diagnose([], [], host) if c.name == "GPU"]


def test_a_profiles_gpu_jobs_fail_and_its_cpu_jobs_pass_on_a_host_without_a_gpu(tmp_path):
    from gpufio import doctor

    host = tree(tmp_path / "root", {"proc/modules": ""})
    prof = from_dict({"global": {"targets": [str(tmp_path)]},
                      "job": [{"name": "block-gpu", "engine": "cpu-gpu"},
                              {"name": "gnn-cpu", "engine": "mmap", "workload": "gnn",
                               "device": "cpu"}]}, "p.toml", {})
    by = {c.name: c for c in doctor.diagnose(prof.jobs, [], host)}
    assert by["GPU for job 'block-gpu'"].status == "fail"
    assert by["GPU for job 'gnn-cpu'"].status == "ok"


def test_doctor_of_a_profile_without_targets_checks_its_scratch_directory(tmp_path):
    from gpufio import doctor

    where = tmp_path / "not-yet" / "scratch"
    prof = from_dict({"global": {"directory": str(where), "iodepth": 8}}, "p.toml", {})
    found = [c for c in doctor.diagnose(prof.jobs, [], Host(str(tmp_path / "root")))
             if c.area == f"scratch {where}"]
    by = {c.name: c for c in found}
    assert by["scratch target"].status == "ok"
    assert f"checked at {tmp_path}, which exists" in by["scratch target"].found
    assert by["storage"].status in ("ok", "warn")  # a real verdict on tmp_path's disk
    assert "O_DIRECT alignment" in by and not (tmp_path / "not-yet").exists()


def test_doctor_json_carries_the_headline():
    from gpufio import doctor

    res = cli.invoke(app, ["doctor", "-f", "json"])
    assert json.loads(res.stdout)["headline"] == doctor.headline()


def test_a_scratch_file_is_checked_once(tmp_path):
    """A profile naming no targets: its scratch file gets the target rows, its directory
    the one line saying the run creates files there, and no second copy of those rows."""
    prof = tmp_path / "p.toml"
    prof.write_text(f'[global]\nsize = "1m"\ndirectory = "{tmp_path}"\n')
    res = CliRunner().invoke(app, ["doctor", str(prof), "-f", "json"])
    assert res.exit_code in (0, 1), res.output
    scratch = [c["name"] for c in json.loads(res.stdout)["checks"]
               if c["area"] == f"scratch {tmp_path}"]
    assert "scratch target" in scratch and "O_DIRECT alignment" in scratch  # nothing laid out
    assert CliRunner().invoke(app, ["prepare", str(prof)]).exit_code == 0
    res = CliRunner().invoke(app, ["doctor", str(prof), "-f", "json"])
    checks = json.loads(res.stdout)["checks"]
    scratch = [c["name"] for c in checks if c["area"] == f"scratch {tmp_path}"]
    files = [c for c in checks if c["area"].startswith(f"target {tmp_path}{os.sep}")]
    assert scratch == ["scratch target"]
    assert {c["name"] for c in files} >= {"O_DIRECT alignment"}
