"""What the kernel, the drivers and their configuration say, read under a root directory
(``/`` on a real host, a fake tree in tests): for ``gpufio doctor``.

Nothing here judges; it reads. The checks that say ok, warn or fail live with what they are
about (each engine's ``doctor``, the targets' in gpufio/doctor.py).
"""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path
from typing import Any


class Host:
    """The readings of one host (or of a fake tree under ``root``)."""

    def __init__(self, root: str = "/", env: dict[str, str] | None = None) -> None:
        self.root = Path(root)
        self.env = dict(os.environ if env is None else env)

    def path(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")

    def read(self, rel: str) -> str | None:
        """A file's text, stripped, or None when it cannot be read."""
        try:
            return self.path(rel).read_text().strip()
        except (OSError, UnicodeDecodeError):
            return None

    def kernel_release(self) -> str:
        return self.read("proc/sys/kernel/osrelease") or os.uname().release

    def kernel_version(self) -> tuple[int, int]:
        m = re.match(r"(\d+)\.(\d+)", self.kernel_release())
        return (int(m.group(1)), int(m.group(2))) if m else (0, 0)

    def kernel_config(self, key: str) -> str | None:
        """A CONFIG_ value ('y', 'm', ...), from /boot/config-<release> or /proc/config.gz;
        None when neither says (or neither exists)."""
        text = self.read(f"boot/config-{self.kernel_release()}")
        if text is None:
            try:
                text = gzip.decompress(self.path("proc/config.gz").read_bytes()).decode()
            except OSError:
                return None
        m = re.search(rf"^{re.escape(key)}=(\S+)$", text, re.M)
        return m.group(1) if m else None

    def module_loaded(self, name: str) -> bool:
        text = self.read("proc/modules") or ""
        return any(line.split()[0] == name for line in text.splitlines() if line.strip()) \
            or self.path(f"sys/module/{name}").is_dir()

    def module_param(self, module: str, param: str) -> str | None:
        return self.read(f"sys/module/{module}/parameters/{param}")

    def nvidia_driver(self) -> tuple[str, bool] | None:
        """(version, open kernel module) of the NVIDIA driver, or None when none is loaded."""
        text = self.read("proc/driver/nvidia/version")
        if not text:
            return None
        m = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+\.\d+(?:\.\d+)?)", text)
        return (m.group(1) if m else "?", "Open Kernel Module" in text)

    def nvidia_fs_version(self) -> str | None:
        """nvidia-fs (the GDS kernel driver): its version when loaded, else None."""
        if not self.module_loaded("nvidia_fs"):
            return None
        text = self.read("proc/driver/nvidia-fs/version") or self.read("sys/module/nvidia_fs/version")
        m = re.search(r"(\d+\.\d+(?:\.\d+)?)", text or "")
        return m.group(1) if m else "loaded"

    def iommu_groups(self) -> int:
        try:
            return len(list(self.path("sys/kernel/iommu_groups").iterdir()))
        except OSError:
            return 0

    def cmdline(self) -> str:
        return self.read("proc/cmdline") or ""

    def io_uring_disabled(self) -> int | None:
        value = self.read("proc/sys/kernel/io_uring_disabled")
        return int(value) if value and value.isdigit() else None

    def cpus(self) -> int:
        """Online CPUs, from the kernel's list ('0-15,32-47')."""
        text = self.read("sys/devices/system/cpu/online")
        return len(parse_cpulist(text)) if text else os.cpu_count() or 1

    def cufile_json(self) -> tuple[str, dict[str, Any] | None, str | None]:
        """(path, settings, error) of cuFile's configuration: $CUFILE_ENV_PATH_JSON or
        /etc/cufile.json; settings None when it is missing or unreadable."""
        path = self.env.get("CUFILE_ENV_PATH_JSON", "/etc/cufile.json")
        text = self.read(path)
        if text is None:
            return path, None, "not found"
        try:
            return path, json.loads(strip_comments(text)), None
        except json.JSONDecodeError as e:
            return path, None, f"not JSON: {e}"

    def gpu_pci_devices(self) -> list[str]:
        """PCI addresses of the NVIDIA GPUs the driver knows (/proc/driver/nvidia/gpus)."""
        try:
            return sorted(p.name for p in self.path("proc/driver/nvidia/gpus").iterdir())
        except OSError:
            return []

    def nvidia_gpu_functions(self) -> list[str]:
        """PCI addresses of NVIDIA display or 3D controllers on the bus, whether or not a
        driver is bound to them (vendor 0x10de, class 0x03xxxx)."""
        found = []
        try:
            devices = sorted(self.path("sys/bus/pci/devices").iterdir())
        except OSError:
            return []
        for dev in devices:
            vendor = self.read(f"sys/bus/pci/devices/{dev.name}/vendor")
            klass = self.read(f"sys/bus/pci/devices/{dev.name}/class")
            if vendor == "0x10de" and (klass or "").startswith("0x03"):
                found.append(dev.name)
        return found

    def has_gpu(self) -> bool:
        """An NVIDIA GPU is here: the driver lists one, or one sits on the PCI bus."""
        return bool(self.gpu_pci_devices() or self.nvidia_gpu_functions())

    def pci_path(self, address: str) -> Path | None:
        """A PCI device's place in the device tree (/sys/devices/pci.../...)."""
        link = self.path(f"sys/bus/pci/devices/{address}")
        return link.resolve() if link.exists() else None


def bar_size(device: Path, bar: int) -> int | None:
    """Bytes of a PCI device's BAR ``bar`` (its line of sysfs ``resource``), None unknown."""
    try:
        lines = (device / "resource").read_text().splitlines()
        start, end = (int(v, 16) for v in lines[bar].split()[:2])
    except (OSError, IndexError, ValueError):
        return None
    return end - start + 1 if end > start else None


# the ACS controls that send peer-to-peer requests up to the root complex instead of across
# a switch: P2P request redirect, completion redirect, upstream forwarding
ACS_REDIRECTS = {0x04: "P2P request redirect", 0x08: "P2P completion redirect",
                 0x10: "upstream forwarding"}
_ACS_ID = 0x000D


def acs_control(device: Path) -> int | None:
    """The ACS control register of a PCI device (bridges and switch ports have one), from
    its extended configuration space; None without ACS or when unreadable (not root)."""
    try:
        config = (device / "config").read_bytes()
    except OSError:
        return None
    offset, seen = 0x100, set()
    while 0x100 <= offset <= len(config) - 8 and offset not in seen:
        seen.add(offset)
        header = int.from_bytes(config[offset:offset + 4], "little")
        if header & 0xFFFF == _ACS_ID:
            return int.from_bytes(config[offset + 6:offset + 8], "little")
        offset = header >> 20
    return None


def strip_comments(text: str) -> str:
    """JSON with ``//`` comments (cufile.json's style) as plain JSON; strings are kept."""
    out, i, in_str = [], 0, False
    while i < len(text):
        c = text[i]
        if in_str:
            out.append(c)
            if c == "\\" and i + 1 < len(text):
                out.append(text[i + 1])
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
            out.append(c)
        elif text.startswith("//", i):
            i = text.find("\n", i)
            if i < 0:
                break
            continue
        else:
            out.append(c)
        i += 1
    return "".join(out)


def cufile_setting(settings: dict[str, Any] | None, dotted: str) -> Any:
    """A cufile.json value by its dotted path ('properties.io_batchsize'), or None."""
    node: Any = settings or {}
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def pci_place_facts(device: Path) -> dict[str, Any]:
    """Where a PCI device sits for the CPUs: the CPUs local to it (its NUMA node's, as the
    kernel lists them) and its BAR1 window, for the result's GPU facts."""
    facts: dict[str, Any] = {}
    try:
        facts["local_cpulist"] = (device / "local_cpulist").read_text().strip()
    except OSError:
        pass
    bar1 = bar_size(device, 1)
    if bar1 is not None:
        facts["bar1_bytes"] = bar1
    return facts


def parse_cpulist(text: str) -> set[int]:
    """The CPUs of a kernel cpulist ("0-7,16-23")."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def pci_relation(a: Path, b: Path) -> str:
    """How two PCI devices (their /sys/devices paths) meet: under one PCIe switch, at one
    root port, in one root complex, or across root complexes (usually other sockets)."""
    pa, pb = a.parts, b.parts
    common = 0
    while common < min(len(pa), len(pb)) and pa[common] == pb[common]:
        common += 1
    roots = [i for i, part in enumerate(pa) if part.startswith("pci")]
    if not roots or common <= roots[0]:
        return "across root complexes"
    below_root = common - roots[0] - 1  # shared bridges below the host bridge
    if below_root <= 0:
        return "same root complex, other root ports"
    if below_root == 1:
        return "same root port"
    return "same PCIe switch"
