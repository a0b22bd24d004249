"""The NVMe rig: one QEMU guest with emulated NVMe controllers that runs commands for tests.

The guest (q35, intel-iommu on, TCG) boots Debian's kernel from the cache ``rig/setup.sh``
fills, shares the host's ``/`` read-only under a tmpfs overlay (it runs this checkout, the
host's interpreter and fio as they are, and nothing it writes reaches the host) and the
session's temporary directory read-write at the same path (what a test writes under its
``tmp_path`` the guest sees, and the other way round). ``rig/agent.sh`` runs in the guest; a
second serial port carries one short line per command, the command itself and its output go
through the shared directory, so a command costs no boot.

Controllers (serials fixed, names ``nvme0``.. in this order, each behind its own
``pcie-root-port``):

- ``rig-gen4``: port asked for 16 GT/s x4; one 1 GiB namespace, 512-byte LBAs; one poll queue.
- ``rig-gen5``: port asked for the fastest speed this QEMU offers (32 GT/s from QEMU 8 on,
  16 GT/s before), x4; one 1 GiB namespace; one poll queue.
- ``rig-4k``: one 256 MiB namespace with 4096-byte LBAs; no poll queue.
- ``rig-mp``: two controllers of one ``nvme-subsys`` sharing two 256 MiB namespaces: the
  multipath heads have two paths each; no poll queue.

QEMU 7.2's emulated controller reports 2.5 GT/s x1 whatever its port asks; the ports' own
links are as asked. Backing files are sparse, zero-filled per boot.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import py_compile
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RIG_DIR = REPO / "rig"
# where rig/setup.sh unpacks the guest kernel, then the reference recipe's place
KERNEL_DIRS = (os.environ.get("GPUFIO_RIG_KERNEL", "/var/cache/gpufio-rig/kernel"),
               "/opt/guest-kernel")
QEMU = "qemu-system-x86_64"
# the initramfs's /bin/busybox (rig/mkinitramfs.sh copies it, rig/setup.sh checks it)
BUSYBOX = os.environ.get("GPUFIO_RIG_BUSYBOX", "/bin/busybox")
BOOT_TIMEOUT_S = float(os.environ.get("GPUFIO_RIG_BOOT_TIMEOUT_S", "600"))
# how long past a command's own timeout the guest may take to answer (the kill, the files)
ANSWER_GRACE_S = 60.0
# the guest's directory of the batch interpreter's FIFOs (tests/rig_batch.py)
SERVE = "/tmp/rig-batch"


class RigError(RuntimeError):
    """The guest did not boot or stopped answering."""


@dataclass(frozen=True)
class Controller:
    """One emulated controller: its serial, the link its root port asks for, its namespaces
    (nsid, bytes, logical block size), its poll queues and its subsystem (None: its own)."""

    serial: str
    speed: str
    width: int
    namespaces: tuple[tuple[int, int, int], ...]
    poll_queues: int = 0
    subsys: str | None = None


def controllers(fastest_speed: str) -> tuple[Controller, ...]:
    """The rig's controllers, in the order they get their names."""
    mp_ns = ((1, 256 << 20, 512), (2, 256 << 20, 512))
    return (Controller("rig-gen4", "16", 4, ((1, 1 << 30, 512),), poll_queues=1),
            Controller("rig-gen5", fastest_speed, 4, ((1, 1 << 30, 512),), poll_queues=1),
            Controller("rig-4k", "16", 4, ((1, 256 << 20, 4096),)),
            Controller("rig-mp", "16", 4, mp_ns, subsys="rig-mp"),
            Controller("rig-mp", "16", 4, mp_ns, subsys="rig-mp"))


def elf_interpreter(path: str) -> str | None:
    """The program loader an ELF executable names (its PT_INTERP), None for a statically
    linked one; ValueError where ``path`` is no 64-bit little-endian ELF file."""
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 64 or head[:6] != b"\x7fELF\x02\x01":
            raise ValueError(f"{path} is not a 64-bit little-endian ELF executable")
        phoff, = struct.unpack_from("<Q", head, 32)
        phentsize, phnum = struct.unpack_from("<HH", head, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
        for i in range(phnum):
            kind, _, offset, _, _, size = struct.unpack_from("<IIQQQQ", table, i * phentsize)
            if kind == 3:  # PT_INTERP
                f.seek(offset)
                return f.read(size).rstrip(b"\0").decode(errors="replace")
    return None


def busybox_problem(path: str) -> str | None:
    """Why ``path`` cannot be the initramfs's busybox, or None: it must exist and be
    statically linked, the initramfs holding no loader or libraries (a dynamic one makes
    the guest panic, "Failed to execute /init")."""
    fix = "run rig/setup.sh as root: it installs busybox-static"
    try:
        interp = elf_interpreter(path)
    except FileNotFoundError:
        return f"no busybox at {path} ({fix})"
    except (OSError, ValueError) as e:
        return f"busybox {path}: {e} ({fix})"
    if interp is not None:
        return (f"{path} is dynamically linked (loader {interp}), the guest could not run "
                f"/init ({fix})")
    return None


def missing() -> str | None:
    """Why the rig cannot boot here (no QEMU, a busybox that is not static, no guest
    kernel, not root), or None."""
    if shutil.which(QEMU) is None:
        return f"no {QEMU} (run rig/setup.sh as root to install the NVMe rig)"
    why = busybox_problem(BUSYBOX)
    if why:
        return why
    if shutil.which("modprobe") is None:
        return "no kmod (run rig/setup.sh as root)"
    if os.geteuid() != 0:
        return "the rig's initramfs needs root (mknod)"
    if find_kernel() is None:
        return f"no guest kernel in {' or '.join(KERNEL_DIRS)} (run rig/setup.sh as root)"
    return None


def without(*tools: str) -> str | None:
    """Why a test cannot use ``tools`` in the guest, or None: it runs the host's own ``/``,
    so a tool missing here (sfdisk without Debian's fdisk) is missing there."""
    gone = [t for t in tools if shutil.which(t) is None]
    return (f"{', '.join(gone)} not installed here, and the guest runs this host's programs "
            "(.ci/run installs them with apt-get)") if gone else None


def find_kernel() -> tuple[str, Path] | None:
    """(version, base directory) of a guest kernel unpacked with dpkg-deb -x, or None."""
    for base in map(Path, KERNEL_DIRS):
        for image in sorted(base.glob("boot/vmlinuz-*")):
            version = image.name[len("vmlinuz-"):]
            if (base / "lib/modules" / version / "modules.dep").exists():
                return version, base
    return None


def extract_vmlinux(bzimage: Path, out: Path) -> None:
    """The ELF vmlinux inside Debian's bzImage (xz or zstd): QEMU boots it through its PVH
    note, skipping real mode and the in-guest decompressor, much faster under TCG."""
    data = bzimage.read_bytes()
    for magic, cmd in ((b"\xfd7zXZ\x00", ["xz", "-dcq"]), (b"(\xb5/\xfd", ["zstd", "-dcq"])):
        off = data.find(magic)
        while off >= 0:
            # trailing bytes after the stream make the tool exit 1; its output is complete
            res = subprocess.run(cmd, input=data[off:], capture_output=True)
            if res.stdout[:4] == b"\x7fELF":
                out.write_bytes(res.stdout)
                return
            off = data.find(magic, off + 1)
    raise RigError(f"rig: no compressed ELF kernel found in {bzimage}")


def _fastest_port_speed() -> str:
    """The fastest x-speed this QEMU's pcie-root-port accepts."""
    res = subprocess.run([QEMU, "-device", "pcie-root-port,help"], capture_output=True,
                         text=True)
    for line in res.stdout.splitlines():
        if "x-speed" in line:
            return "32" if "/32" in line else "16"
    return "16"


def qemu_args(ctrls: tuple[Controller, ...], work: Path, share: Path, kernel: Path,
              initrd: Path, moddir: Path, sock: Path) -> list[str]:
    """The QEMU command line of the guest."""
    dev: list[str] = ["-device", "intel-iommu,intremap=on"]
    subsystems: set[str] = set()
    drives: dict[tuple[str, int], str] = {}
    # every controller before any namespace: QEMU attaches a shared namespace to the
    # controllers its subsystem has when the namespace is made
    for i, c in enumerate(ctrls):
        port = f"rp{i}"
        dev += ["-device", f"pcie-root-port,id={port},bus=pcie.0,chassis={i + 1},"
                           f"addr={0x10 + i:#x},x-speed={c.speed},x-width={c.width}"]
        if c.subsys and c.subsys not in subsystems:
            subsystems.add(c.subsys)
            dev += ["-device", f"nvme-subsys,id={c.subsys},nqn={c.subsys}"]
        dev += ["-device", f"nvme,id=nvme{i},serial={c.serial},bus={port}"
                + (f",subsys={c.subsys}" if c.subsys else "")]
    for i, c in enumerate(ctrls):
        for nsid, size, lbs in c.namespaces:
            key = (c.subsys or c.serial, nsid)
            if key in drives:  # a namespace of the subsystem: made once, shared by all
                continue
            drives[key] = name = f"d{len(drives)}"
            image = work / f"{c.serial}-ns{nsid}.img"
            with open(image, "wb") as f:
                f.truncate(size)
            dev += ["-drive", f"file={image},if=none,id={name},format=raw,cache=unsafe",
                    "-device", f"nvme-ns,drive={name},bus=nvme{i},nsid={nsid},"
                               f"logical_block_size={lbs},physical_block_size={lbs}"]
    poll = ",".join(str(c.poll_queues) for c in ctrls)
    paths = sum(len(c.namespaces) for c in ctrls)
    # no_timer_check: under TCG on a busy host the kernel's IO-APIC timer test can miss its
    # window and panic ("timer doesn't work through Interrupt-remapped IO-APIC")
    append = (f"console=ttyS0 panic=-1 loglevel=4 mitigations=off intel_iommu=on iommu=pt "
              f"no_timer_check "
              f"rig.agent={RIG_DIR / 'agent.sh'} rig.rw={share} rig.moddir={moddir} "
              f"rig.poll={poll} rig.paths={paths}")
    accel = os.environ.get("GPUFIO_RIG_ACCEL", "tcg")
    cpu = "host" if accel.startswith("kvm") else "max"
    return [QEMU, "-accel", accel, "-cpu", cpu, "-machine", "q35,kernel-irqchip=split",
            "-m", "1G", "-smp", "2", "-nodefaults", "-no-user-config", "-display", "none",
            "-monitor", "none", "-no-reboot", "-bios", "/usr/share/qemu/qboot.rom",
            "-serial", f"file:{work / 'console.log'}",
            "-chardev", f"socket,id=ctl,path={sock}", "-serial", "chardev:ctl",
            *dev,
            "-virtfs", "local,path=/,mount_tag=host,security_model=none,readonly=on,"
                       "multidevs=remap",
            "-virtfs", f"local,path={share},mount_tag=rw,security_model=none,multidevs=remap",
            "-kernel", str(kernel), "-initrd", str(initrd), "-append", append]


def _build_helpers(out: Path) -> None:
    """gpufio's compiled helpers (native/build.py) built here for any x86-64, for the guest:
    building them in it, the compiler under TCG, took it minutes; built with -march=native
    here they would carry instructions TCG does not have. tests/rig_batch.py installs them
    under the names the guest's gpufio looks for; where they are missing it builds its own."""
    from gpufio.native import build as native
    from gpufio.io import loops

    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        return
    out.mkdir(exist_ok=True)
    builds = [subprocess.Popen([cc, "-O3", "-fPIC", "-shared", *options, "-o",
                                str(out / f"{name}.so"), *map(str, sources)],
                               stderr=subprocess.DEVNULL)
              for name, sources, options in (("pattern_fill", (native.SOURCE,), ()),
                                             ("loops", loops.SOURCES, loops.OPTIONS))]
    for build in builds:
        build.wait()


def _die_with_parent() -> None:
    """In QEMU's child before exec: the kernel kills it when the test process dies, however
    that happens, so no guest outlives its pytest run."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass(frozen=True)
class Sh:
    """A step of ``Rig.batch``: a shell snippet (``sh -c CMD``)."""

    cmd: str

    def step(self) -> dict:
        """The step as tests/rig_batch.py reads it."""
        return {"sh": self.cmd}

    def args(self) -> str:
        """The step's CompletedProcess.args."""
        return self.cmd


@dataclass(frozen=True)
class Py:
    """A step of ``Rig.batch``: ``python3 PATH ARGS`` (PATH relative to the repository)."""

    path: str
    argv: tuple[str, ...] = ()

    def step(self) -> dict:
        """The step as tests/rig_batch.py reads it."""
        return {"py": self.path, "args": list(self.argv)}

    def args(self) -> list[str]:
        """The step's CompletedProcess.args."""
        return ["python3", self.path, *self.argv]


class Rig:
    """A booted guest: ``run`` commands in it, look up its namespaces by serial and nsid."""

    def __init__(self, work: Path, share: Path) -> None:
        """Boot the guest; ``work`` holds its images and logs, ``share`` (a directory the
        tests write under) is shared read-write at the same path. RigError, with the
        console's last lines, where it does not boot."""
        self.work, self.share = work, share
        self.controllers = controllers(_fastest_port_speed())
        self._seq = 0
        self._broken: str | None = None
        found = find_kernel()
        assert found is not None
        version, base = found
        t0 = time.monotonic()
        kernel, initrd = work / f"vmlinux-{version}", work / "initramfs.cpio.gz"
        extract_vmlinux(base / "boot" / f"vmlinuz-{version}", kernel)
        made = subprocess.run(["bash", str(RIG_DIR / "mkinitramfs.sh"), version, str(base),
                               str(initrd)], capture_output=True, text=True,
                              env={**os.environ, "GPUFIO_RIG_BUSYBOX": BUSYBOX})
        if made.returncode:
            raise RigError(f"rig: rig/mkinitramfs.sh failed ({made.returncode}): "
                           f"{made.stderr.strip()}")
        (share / "cmd").mkdir(parents=True, exist_ok=True)
        # python3 in the guest is this interpreter: a pyenv shim takes tens of seconds there
        self._bin = work / "bin"
        self._bin.mkdir(exist_ok=True)
        for name in ("python3", "python"):  # a wrapper, not a link: sys.executable as here
            wrapper = self._bin / name
            wrapper.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} \"$@\"\n")
            wrapper.chmod(0o755)
        # the batch interpreter (tests/rig_batch.py) starts with the guest and imports
        # gpufio while the controllers are bound; its FIFOs exist before the agent is ready.
        # gpufio's bytecode, compiled here in a second, is copied into the guest's overlay
        # (never the host's tree): compiling it under TCG took the guest far longer
        pyc = work / "pyc"
        for src in (REPO / "gpufio").rglob("*.py"):
            cfile = Path(importlib.util.cache_from_source(str(src))).relative_to(REPO)
            py_compile.compile(str(src), cfile=str(pyc / cfile), doraise=True)
        _build_helpers(work / "native")
        (share / "cmd" / "warm.sh").write_text(self._script(
            f"echo \"rig_batch: [$(cut -d' ' -f1 /proc/uptime)] start\"\n"
            f"cp -R {pyc}/. {shlex.quote(str(REPO))}/\n"
            f"mkdir -p {SERVE} && mkfifo {SERVE}/req {SERVE}/rep || exit 1\n"
            f"exec python3 tests/rig_batch.py {SERVE} {work / 'native'}"))
        sock = work / "ctl.sock"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(sock))
        listener.listen(1)
        listener.settimeout(60)
        args = qemu_args(self.controllers, work, share, kernel, initrd, base / "lib/modules",
                         sock)
        self._qemu = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=open(work / "qemu.err", "w"),
                                      preexec_fn=_die_with_parent)
        try:
            self._conn, _ = listener.accept()
        except OSError as e:
            self.close()
            raise RigError(f"rig: QEMU did not connect its control line: {e}; "
                           f"{self._tail(work / 'qemu.err')}") from None
        finally:
            listener.close()
        self._lines = self._conn.makefile("r", encoding="utf-8", errors="replace")
        waited = time.monotonic()
        first = self._answer(BOOT_TIMEOUT_S)
        if not first.startswith("ready"):
            # a panicked guest took QEMU down (-no-reboot); a stuck one has no poweroff to wait for
            how = (repr(first) if first else "QEMU ended" if time.monotonic() - waited
                   < BOOT_TIMEOUT_S else f"no answer in {BOOT_TIMEOUT_S:.0f} s")
            self._qemu.kill()
            self._qemu.wait()
            self._conn.close()
            err = work / "qemu.err"
            raise RigError(f"rig: the guest did not get ready: {how}; "
                           f"{self._tail(work / 'console.log')}"
                           + (f"\n{self._tail(err)}" if err.stat().st_size else ""))
        self.boot_s = time.monotonic() - t0
        self._map: dict[tuple[str, int], tuple[str, str, list[str]]] = {}
        for line in (share / "rig-map").read_text().splitlines():
            serial, nsid, block, generic, ctrl = line.split()
            entry = self._map.setdefault((serial, int(nsid)), (block, generic, []))
            entry[2].append(ctrl)

    @staticmethod
    def _tail(path: Path, lines: int = 30) -> str:
        try:
            last = path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return f"no {path}"
        return f"last lines of {path}:\n" + "\n".join(last) if last else f"{path} is empty"

    def _answer(self, timeout: float) -> str:
        """The guest's next line on the control port ('' when it went away)."""
        self._conn.settimeout(timeout)
        try:
            return self._lines.readline().strip()
        except (TimeoutError, OSError):
            return ""

    def run(self, cmd: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run the shell snippet ``cmd`` in the guest as root, in the repository's root with
        the host's PATH (``python3`` the host's interpreter); raises
        subprocess.TimeoutExpired when it ran past ``timeout`` seconds (it is killed)."""
        if self._broken:
            raise RigError(self._broken)
        self._seq += 1
        job = self.share / "cmd" / str(self._seq)
        job.with_suffix(".sh").write_text(self._script(cmd))
        self._conn.sendall(f"{self._seq} {max(1, int(timeout + 0.999))}\n".encode())
        answer = self._answer(timeout + ANSWER_GRACE_S).split()
        if answer[:2] != ["done", str(self._seq)]:
            self._broken = (f"rig: the guest stopped answering (command {cmd!r} got "
                            f"{' '.join(answer)!r}); {self._tail(self.work / 'console.log')}")
            raise RigError(self._broken)
        rc, seconds = int(answer[2]), int(answer[3])
        out = job.with_suffix(".out").read_text(errors="replace")
        err = job.with_suffix(".err").read_text(errors="replace")
        if rc in (124, 137) and seconds >= timeout:
            raise subprocess.TimeoutExpired(cmd, timeout, out, err)
        return subprocess.CompletedProcess(cmd, rc, out, err)

    def _script(self, cmd: str) -> str:
        """The guest's shell script running ``cmd`` as ``run`` promises."""
        path = f"{self._bin}:{os.environ.get('PATH', '')}"
        home = os.environ.get("HOME", "/root")
        # PYTHONPATH: a script under tests/ imports the gpufio of the tree under test too
        return (f"export PATH={shlex.quote(path)} HOME={shlex.quote(home)} "
                f"PYTHONPATH={shlex.quote(str(REPO))}\n"
                f"cd {shlex.quote(str(REPO))} || exit 125\n{cmd}\n")

    def batch(self, *steps: list[str] | Sh | Py, timeout: float = 600
              ) -> list[subprocess.CompletedProcess[str]]:
        """Run the steps one after another in the guest, each a process forked from the
        batch interpreter that imported gpufio at boot (tests/rig_batch.py): a list is
        ``python3 -m gpufio LIST``, ``Py`` a Python script, ``Sh`` a shell snippet; one
        CompletedProcess (status, stdout, stderr) per step. A step still running after
        ``timeout`` seconds (all steps together) is killed and the rest not started: status
        124, as ``timeout`` gives it."""
        self._seq += 1
        ins, outs = (self.share / "cmd" / f"batch-{self._seq}.{x}.json" for x in ("in", "out"))
        ins.write_text(json.dumps([s.step() if isinstance(s, (Sh, Py)) else list(s)
                                   for s in steps]))
        res = self.run(f"printf '%s %s %s\\n' {ins} {outs} {timeout} > {SERVE}/req && "
                       f"read -r answer < {SERVE}/rep && [ \"$answer\" = done ]",
                       timeout=timeout + ANSWER_GRACE_S)
        if res.returncode != 0:
            raise RigError(f"rig: the batch interpreter failed ({res.returncode}): "
                           f"{res.stderr}; {self._tail(self.share / 'cmd' / 'warm.out')}")
        return [subprocess.CompletedProcess(s.args() if isinstance(s, (Sh, Py))
                                            else ["gpufio", *s], r["rc"], r["stdout"],
                                            r["stderr"])
                for s, r in zip(steps, json.loads(outs.read_text()))]

    def gpufio(self, *argvs: list[str], timeout: float = 600
               ) -> list[subprocess.CompletedProcess[str]]:
        """Each ``gpufio ARGV`` in the guest (``batch``): one CompletedProcess per command,
        as ``python3 -m gpufio ARGV`` gives it."""
        return self.batch(*argvs, timeout=timeout)

    def _lookup(self, serial: str, nsid: int) -> tuple[str, str, list[str]]:
        try:
            return self._map[(serial, nsid)]
        except KeyError:
            raise KeyError(f"rig: no namespace {nsid} on a controller with serial {serial!r}; "
                           f"there are {sorted(self._map)}") from None

    def namespace(self, serial: str, nsid: int) -> str:
        """The block device (/dev/nvmeXnY, the multipath head where there is one) of
        namespace ``nsid`` of the controller with ``serial``."""
        return self._lookup(serial, nsid)[0]

    def generic(self, serial: str, nsid: int) -> str:
        """The NVMe generic char device (/dev/ngXnY) of that namespace."""
        return self._lookup(serial, nsid)[1]

    def controller_names(self, serial: str) -> list[str]:
        """The guest's names (nvme0, ...) of the controllers with ``serial``."""
        return sorted({c for (s, _), (_, _, cs) in self._map.items() if s == serial for c in cs})

    def close(self) -> None:
        """Power the guest off (it syncs first), or kill QEMU when it does not go."""
        try:
            self._conn.sendall(b"quit\n")
        except (AttributeError, OSError):
            pass
        try:
            self._qemu.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._qemu.kill()
            self._qemu.wait()
