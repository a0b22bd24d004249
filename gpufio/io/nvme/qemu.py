"""QEMU's hw/nvme, a controller nobody on this project wrote, driven with no guest OS: QEMU
runs with its vCPU never started (``-accel tcg -S``: Debian's QEMU has no qtest
accelerator, but the qtest socket answers under any), its guest RAM a shared file that
gpufio maps too. PCI config cycles and register accesses go over the qtest socket
(``-qtest unix:SOCK``, gpufio listening first: QEMU is the client); queues, PRP lists and
data live in the shared file, whose offsets are guest physical addresses, which are the
controller's bus addresses.

``QemuNvme`` starts QEMU and hands out a ``vfio.Device`` look-alike (``device``), so the host
driver (io/nvme/pcie_vfio.Controller) brings QEMU's controller up and drives it as a drive.
With shadow doorbells on (Doorbell Buffer Config), QEMU reads the SQ tails from memory but
looks only after some MMIO write to a doorbell: ``Kicker`` writes one periodically.
"""

from __future__ import annotations

import mmap
import os
import queue
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from gpufio.core import processes
from gpufio.io.nvme import spec as nq
from gpufio.io.nvme.memory import carve
from gpufio.io.nvme.shared import Buffer

BAR0 = 0xE000_0000    # where gpufio places the controller's BAR0 (q35's PCI hole)
RAM_START = 2 << 20   # guest memory below 1 MiB is VGA, PAM and BIOS, not RAM
VENDOR_DEVICE = 0x0010_1B36  # QEMU's NVMe controller (1b36:0010)
PCI_COMMAND_MEMORY, PCI_COMMAND_MASTER = 0x2, 0x4
START_S = 30.0        # QEMU connecting to the socket, on a loaded machine
STOP_S = 5.0
ADMIN_DBBUF = 0x7C    # Doorbell Buffer Config
KICK_S = 0.0005       # the period of the kick a shadow doorbell needs


def binary() -> str | None:
    """The QEMU to run (GPUFIO_QEMU, else qemu-system-x86_64 on PATH), or None."""
    return shutil.which(os.environ.get("GPUFIO_QEMU", "qemu-system-x86_64"))


def firmware_dirs(qemu: str) -> list[str]:
    """``-L`` options for a QEMU unpacked under a prefix of its own (``dpkg -x`` of its
    packages, carried to a machine with no registry): its SeaBIOS and data beside it, which
    it would not look for there (an installed QEMU finds its own)."""
    share = Path(qemu).resolve().parent.parent / "share"
    if share == Path("/usr/share"):
        return []
    return [arg for d in ("seabios", "qemu") if (share / d).is_dir()
            for arg in ("-L", str(share / d))]


class Qtest:
    """QEMU's qtest protocol: one command a line, one ``OK [value]`` a command, in order;
    QEMU's asynchronous ``IRQ`` lines are skipped. Thread-safe (a kicker shares it)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self._buf, self._lock = sock, b"", threading.Lock()

    def _line(self) -> bytes:
        while True:
            i = self._buf.find(b"\n")
            if i >= 0:
                line, self._buf = self._buf[:i], self._buf[i + 1:]
                if not line.startswith(b"IRQ"):
                    return line
                continue
            more = self.sock.recv(65536)
            if not more:
                raise EOFError("QEMU closed the qtest socket")
            self._buf += more

    def commands(self, lines: list[str]) -> list[int]:
        """Send ``lines`` in one write and wait for every answer: their values (0 if none)."""
        with self._lock:
            self.sock.sendall(("\n".join(lines) + "\n").encode())
            out = []
            for line in lines:
                got = self._line().split()
                if not got or got[0] != b"OK":
                    raise RuntimeError(f"qtest: {line!r} answered {b' '.join(got)!r}")
                out.append(int(got[1], 16) if len(got) > 1 else 0)
            return out

    def command(self, line: str) -> int:
        return self.commands([line])[0]


class Config:
    """PCI configuration space through mechanism #1 (ports 0xCF8/0xCFC) of bus 0."""

    def __init__(self, qt: Qtest, dev: int) -> None:
        self.qt, self.dev = qt, dev

    def _addr(self, off: int, dev: int | None = None) -> str:
        d = self.dev if dev is None else dev
        return f"outl 0xcf8 {0x8000_0000 | d << 11 | (off & 0xFC):#x}"

    def r32(self, off: int, dev: int | None = None) -> int:
        return self.qt.commands([self._addr(off, dev), "inl 0xcfc"])[1]

    def w32(self, off: int, value: int) -> None:
        self.qt.commands([self._addr(off), f"outl 0xcfc {value:#x}"])

    def w16(self, off: int, value: int) -> None:
        self.qt.commands([self._addr(off), f"outw {0xcfc + (off & 2):#x} {value:#x}"])


class QtestBar:
    """BAR0 through qtest: the ``vfio.Bar`` accessors, each one round trip to QEMU."""

    def __init__(self, qt: Qtest, base: int) -> None:
        self.qt, self.base = qt, base

    def r32(self, off: int) -> int:
        return self.qt.command(f"readl {self.base + off:#x}")

    def w32(self, off: int, value: int) -> None:
        self.qt.command(f"writel {self.base + off:#x} {value & 0xFFFFFFFF:#x}")

    def r64(self, off: int) -> int:
        return self.qt.command(f"readq {self.base + off:#x}")


class QemuDevice:
    """QEMU's NVMe function as a ``vfio.Device`` look-alike: BAR0 over qtest, DMA memory
    from the shared guest RAM (a bump allocator: bus address = guest physical address),
    which is all its DMA reaches (``maps_host_memory``)."""

    maps_host_memory = False

    def __init__(self, qt: Qtest, ram: np.ndarray) -> None:
        self.qt, self.ram, self.bdf = qt, ram, "qemu"
        self._next = RAM_START
        self._lock = threading.Lock()  # a job's workers (threads) allocate at once
        for dev in range(32):
            if Config(qt, dev).r32(0) == VENDOR_DEVICE:
                self.config = Config(qt, dev)
                break
        else:
            raise RuntimeError("QEMU: no NVMe controller (1b36:0010) on PCI bus 0")
        self.bdf = f"qemu 0000:00:{dev:02x}.0"
        self.config.w32(0x10, BAR0)  # a 64-bit memory BAR: low half, then high
        self.config.w32(0x14, 0)
        self.bus_master(False)  # memory decoding on: BAR0 answers from now on
        self.bar0 = QtestBar(qt, BAR0)

    def bus_master(self, on: bool) -> None:
        """Memory decoding on, and bus mastering (the controller's DMA) on or off."""
        self.config.w16(0x04, PCI_COMMAND_MEMORY | (PCI_COMMAND_MASTER if on else 0))

    def memory(self, size: int) -> Buffer:
        with self._lock:
            view, start = carve(self.ram, self._next, size, "QEMU guest memory")
            self._next = start + len(view)
        return Buffer(view, start)

    def forget(self, mem: Buffer) -> None:
        """Nothing to unmap: the bump allocator keeps it until QEMU goes."""

    def close(self) -> None:
        """The memory goes with QEMU (QemuNvme.close)."""


_launcher: queue.Queue | None = None
_launcher_lock = threading.Lock()


def _launch(argv: list[str], log: Any) -> subprocess.Popen:
    """Start ``argv`` from gpufio's QEMU launcher thread, which lives as long as the
    process: PR_SET_PDEATHSIG fires when the starting thread ends, and a job's worker
    thread that started QEMU may end while other workers still drive it."""
    global _launcher
    with _launcher_lock:
        if _launcher is None:
            _launcher = queue.Queue()
            threading.Thread(target=_serve_launches, args=(_launcher,), daemon=True,
                             name="qemu-launcher").start()
    answer: queue.Queue = queue.Queue()
    _launcher.put((argv, log, answer))
    got = answer.get()
    if isinstance(got, BaseException):
        raise got
    return got


def _serve_launches(requests: queue.Queue) -> None:
    while True:
        argv, log, answer = requests.get()
        try:
            answer.put(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True,
                                        preexec_fn=processes.die_with_parent_exec()))
        except BaseException as e:  # handed to the caller, raised there
            answer.put(e)


class QemuNvme:
    """QEMU with one NVMe controller serving ``image`` (a raw file) as namespace 1 with
    ``lba_bytes`` blocks, its guest RAM (``ram_bytes``) a file in a directory of its own
    on tmpfs (/dev/shm, where CUDA can pin it), removed once both have mapped it. QEMU
    dies with gpufio (PR_SET_PDEATHSIG, from a launcher thread that lives as long as the
    process) and sits in a session of its own, so a Ctrl-C reaches gpufio, which stops it.
    A context manager."""

    def __init__(self, image: str, lba_bytes: int = 512, ram_bytes: int = 128 << 20) -> None:
        qemu = binary()
        if qemu is None:
            raise RuntimeError("QEMU: no qemu-system-x86_64 on PATH (apt-get install "
                               "qemu-system-x86)")
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.where = tempfile.mkdtemp(prefix="gpufio-qemu-", dir=base)
        self.proc: subprocess.Popen | None = None
        self._map: mmap.mmap | None = None
        try:
            self._start(qemu, image, lba_bytes, ram_bytes)
        except BaseException:
            self.close()
            raise

    def _start(self, qemu: str, image: str, lba_bytes: int, ram_bytes: int) -> None:
        sock_path, ram_path = f"{self.where}/qtest.sock", f"{self.where}/ram"
        ram = f"{ram_bytes >> 20}M"
        drive = f"file={image},if=none,id=d0,format=raw"
        nvme = "nvme,drive=d0,serial=gpufio-qemu" + (
            f",logical_block_size={lba_bytes},physical_block_size={lba_bytes}"
            if lba_bytes != 512 else "")
        argv = [qemu, *firmware_dirs(qemu), "-machine", "q35,memory-backend=m", "-accel",
                "tcg", "-S", "-m", ram,
                "-object", f"memory-backend-file,id=m,size={ram},mem-path={ram_path},share=on",
                "-display", "none", "-nodefaults", "-no-user-config",
                "-qtest", f"unix:{sock_path}", "-qtest-log", "none",
                "-drive", drive, "-device", nvme]
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(sock_path)
            listener.listen(1)
            listener.settimeout(0.05)
            self._log = open(f"{self.where}/qemu.log", "w+")
            self.proc = _launch(argv, self._log)
            deadline = time.monotonic() + START_S
            while True:
                try:
                    conn, _ = listener.accept()
                    break
                except socket.timeout:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        self._log.seek(0)
                        raise RuntimeError(f"QEMU did not connect to its qtest socket "
                                           f"(exit {self.proc.poll()}): "
                                           f"{self._log.read().strip()[-400:]}")
        finally:
            listener.close()
        conn.settimeout(None)
        self.qt = Qtest(conn)
        self.qt.command("outl 0xcf8 0x80000000")  # the first answer: the machine is up
        fd = os.open(ram_path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED)
        finally:
            os.close(fd)
        # both sides hold what they need open: nothing of QEMU's is left on disk, even
        # where gpufio is killed
        shutil.rmtree(self.where, ignore_errors=True)
        self.ram = np.frombuffer(self._map, np.uint8)
        self.device = QemuDevice(self.qt, self.ram)

    def ended(self) -> str:
        """Why QEMU cannot answer, where its process has ended, as a clause a stall report
        appends; else ""."""
        code = None if self.proc is None else self.proc.poll()
        return "" if code is None else f"; QEMU has ended (exit code {code})"

    def close(self) -> None:
        """Stop QEMU (SIGTERM: it does not exit when the socket closes; SIGKILL if it
        lingers), unmap and remove its files."""
        if getattr(self, "qt", None) is not None:
            self.qt.sock.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.ram = self.device = None  # type: ignore[assignment]
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # views still held: the mapping goes with the last
                pass
        if getattr(self, "_log", None) is not None:
            self._log.close()
        shutil.rmtree(self.where, ignore_errors=True)

    def __enter__(self) -> "QemuNvme":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Kicker:
    """Shadow doorbells (Doorbell Buffer Config) for ``pairs`` of a controller over qtest:
    the host (or GPU threads) writes SQ tails and CQ heads into the shadow page only, and
    this thread writes an MMIO SQ doorbell of each pair every ``period`` seconds, since QEMU
    looks at an SQ again only after some doorbell write (the value does not matter once
    the shadow is on). ``shadow``: the shadow page's u32 words by doorbell index."""

    def __init__(self, device: QemuDevice, controller: Any, pairs: list[Any],
                 period: float = KICK_S) -> None:
        """``controller``: the io/nvme/pcie_vfio.Controller of ``device``; ``pairs``: its
        QueuePairs."""
        self.device, self.pairs, self.period = device, pairs, period
        shadow, events = device.memory(nq.PAGE), device.memory(nq.PAGE)
        controller.command(_dbbuf, shadow.iova, events.iova)
        self.shadow = shadow.map.view("<u4")
        self.events = events.map.view("<u4")
        self.kicks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="qemu-kicker")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.device.qt.commands([f"writel {BAR0 + p.sq_db:#x} 0x0" for p in self.pairs])
            self.kicks += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def _dbbuf(cid: int, shadow: int, events: int) -> np.ndarray:
    """Doorbell Buffer Config: the shadow doorbell page (PRP1) and the event index page
    (PRP2)."""
    e = nq.admin_command(ADMIN_DBBUF, cid, prp1=shadow)
    e["prp2"] = events
    return e
