"""Fixtures shared by the tests of every folder: a private scratch directory, small
pattern-filled targets, an engine that offers only a channel (``pread_engine``), mmap staged
in host memory (``host_mmap``), a fake clock, profiles and result documents written for a
test, and a checkpoint's files checked against the pattern (``plan_holds_pattern``).

Tests marked ``gpu`` are skipped, with the reason, where no usable GPU is found; tests marked
``nvme`` take the ``nvme_rig`` fixture (one QEMU guest with emulated NVMe for the whole run,
tests/rig.py), skipped with the reason where QEMU, a static busybox or a guest kernel is
missing, or where the guest does not boot (the reason then ends with its console's last lines).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, ContextManager, Iterator, Sequence

import numpy as np
import pytest

from gpufio.core import events, pattern, targets
from gpufio.core.requests import Capability, Channel, ChannelSpec, File


class PreadChannel(Channel):
    """Reads and writes with pread/pwrite at reap time: requests are in flight between
    submit and reap, as on a ring."""

    def __init__(self, files: Sequence[File], spec: ChannelSpec) -> None:
        super().__init__(spec)
        self._fds = [f.fd for f in files]
        self._queued: list[tuple[int, int, int, int, bool, int]] = []

    @property
    def inflight(self) -> int:
        return len(self._queued)

    def submit(self, tgt, off, length, addr, write, tag) -> int:
        k = min(self.room(), len(off))
        w = np.broadcast_to(np.asarray(write, bool), (len(off),))
        self._queued += zip(*(np.asarray(x)[:k].tolist() for x in (tgt, off, length, addr)),
                            w[:k].tolist(), np.asarray(tag)[:k].tolist())
        return k

    def reap(self, wait_ns):
        import ctypes

        tags, res = [], []
        for t, o, n, a, w, g in self._queued:
            view = (ctypes.c_char * n).from_address(a)
            res.append(os.pwrite(self._fds[t], view, o) if w
                       else os.preadv(self._fds[t], [view], o))
            tags.append(g)
        self._queued = []
        return np.array(tags, np.int64), np.array(res, np.int64)


@pytest.fixture
def pread_engine():
    """An engine that implements only its channel, "test-pread" (a test double, registered
    for the test): no queue, no loop, nothing that runs."""
    from gpufio import engines
    from gpufio.engines import all_engines, register
    from gpufio.engines.base import Engine

    class Pread(Engine):
        name = "test-pread"
        summary = "test double: a channel and nothing else"
        capability = Capability()

        @classmethod
        def channel(cls, job, files, spec):
            return PreadChannel(files, spec)

    all_engines()
    register(Pread)
    yield Pread
    engines._REGISTRY.pop("test-pread")


class HostStaging:
    """io/staging.SegmentedStaging's host half, for the staged engines (mmap, cpu-gpu) run
    without a GPU: its copies are done at once, and the check a copy queues on the GPU runs
    on the CPU (core/pattern) instead."""

    def __init__(self, gpu_index, segments, per_segment, bs, verify, writes=False):
        self.per_segment, self.bs = per_segment, bs
        n = segments * per_segment * bs
        raw = np.zeros(n + 4096, np.uint8)  # page-aligned, as pinned memory is: O_DIRECT
        self.host = raw[-raw.ctypes.data % 4096:][:n]
        self.host_addr = self.host.ctypes.data
        self._bad: dict[int, set[int]] = {}
        self.copies = []  # (segment, I/Os) of every copy to the GPU
        self.log = []  # copies down and the channel's stores, in order

    def _slots(self, seg, k):
        lo = seg * self.per_segment * self.bs
        return self.host[lo:lo + k * self.bs].reshape(k, self.bs)

    def copy(self, seg, k, offs=None, seeds=None):
        self.copies.append((seg, k))
        self._bad[seg] = set() if offs is None else set(
            pattern.bad_ios_host(self._slots(seg, k), offs, seeds, self.bs).tolist())

    def stage_out(self, seg, k, offs, seeds):
        self.log.append("copy down")
        pattern.fill_ios(self._slots(seg, k), offs, seeds)

    def done(self, seg):
        return True

    def wait(self, seg):
        pass

    def mismatches(self, seg, res):
        return [i for i in sorted(self._bad[seg]) if res[i] == self.bs]

    def close(self):
        self.host = None


def _host_staged(monkeypatch, base: type, name: str):
    """``base`` as it is, but available without a GPU, registered as ``name``, its staging
    in host memory (HostStaging): yields the stagings made, in order."""
    from gpufio import engines
    from gpufio.engines import all_engines, register
    from gpufio.loops import block_staged as staged

    host = type(f"Host{base.__name__}", (base,), {
        "name": name, "unavailable": classmethod(lambda cls: None)})
    stagings = []

    def staging(*args, **kwargs):
        stagings.append(HostStaging(*args, **kwargs))
        return stagings[-1]

    monkeypatch.setattr(staged, "SegmentedStaging", staging)
    all_engines()
    register(host)
    yield stagings
    engines._REGISTRY.pop(name)


@pytest.fixture
def host_mmap(monkeypatch):
    """mmap as it is, but available without a GPU, registered as "test-mmap", its staging
    in host memory: the stagings made, in order (their copies and logs)."""
    from gpufio.engines.mmap import Mmap

    yield from _host_staged(monkeypatch, Mmap, "test-mmap")


@pytest.fixture
def host_cpugpu(monkeypatch):
    """cpu-gpu (io_uring into the staging's host slots) as it is, but available without a
    GPU, registered as "test-cpu-gpu", its staging in host memory: the stagings made."""
    from gpufio.engines.cpugpu import CpuGpu

    yield from _host_staged(monkeypatch, CpuGpu, "test-cpu-gpu")


@pytest.fixture(autouse=True, scope="session")
def _cache_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the compiled helpers (native/build.py) into the session's temporary directory,
    never into ~/.cache: one build, before any test, serves every test of the run and the
    gpufio processes they start (a build inside one would move its timing)."""
    from gpufio.core import pattern
    from gpufio.io import loops

    d = tmp_path_factory.mktemp("cache")
    os.environ["XDG_CACHE_HOME"] = str(d)
    loops.available()
    pattern.native_fill()
    return d


@pytest.fixture(autouse=True)
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, _cache_home: Path) -> Path:
    """Keep auto-created target files inside the test's own temporary directory, and every
    other cache gpufio keeps (``$XDG_CACHE_HOME/gpufio``) in the run's: tests never write
    into the user's ~/.cache."""
    d = tmp_path / "scratch"
    monkeypatch.setenv("GPUFIO_SCRATCH", str(d))
    monkeypatch.setenv("XDG_CACHE_HOME", str(_cache_home))
    return d


@pytest.fixture
def pattern_file(tmp_path: Path) -> Path:
    """A 4 MiB target carrying the data pattern with seed 1234."""
    path = tmp_path / "target.dat"
    targets.create_file(str(path), 4 << 20, 1234)
    return path


@pytest.fixture
def shm_pattern_file():
    """A 1 MiB pattern file (seed 7) on the /dev/shm tmpfs: a RAM-backed target."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm tmpfs here")
    path = Path(f"/dev/shm/gpufio-test-{os.getpid()}.dat")
    path.unlink(missing_ok=True)
    targets.create_file(str(path), 1 << 20, 7)
    yield path
    path.unlink(missing_ok=True)


@pytest.fixture
def pattern_fd(pattern_file: Path):
    """pattern_file opened O_DIRECT for reading."""
    fd = os.open(pattern_file, os.O_RDONLY | os.O_DIRECT)
    yield fd
    os.close(fd)


@pytest.fixture
def losetup():
    """Attach an image file as a loop device, with direct I/O to it or through its page
    cache (root and losetup needed, else the test is skipped with the reason); every device
    is detached afterwards."""
    attached: list[str] = []

    def attach(path: Path, direct_io: bool = False) -> str:
        if os.geteuid() != 0 or not shutil.which("losetup"):
            pytest.skip("needs root and losetup to attach a loop device")
        res = subprocess.run(["losetup", "--find", "--show",
                              f"--direct-io={'on' if direct_io else 'off'}", str(path)],
                             capture_output=True, text=True)
        if res.returncode != 0:
            pytest.skip(f"losetup cannot attach a loop device here: {res.stderr.strip()}")
        attached.append(res.stdout.strip())
        return attached[-1]

    yield attach
    for dev in attached:
        subprocess.run(["losetup", "-d", dev], check=False)


@pytest.fixture
def write_profile(tmp_path: Path):
    """Write TOML text to a profile file and return its path."""
    def write(text: str, name: str = "job.toml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path
    return write


@pytest.fixture
def write_json(tmp_path: Path):
    """Write a document (a result file, a baseline) as JSON into the test's directory and
    return its path."""
    import json

    def write(name: str, doc: object) -> Path:
        path = tmp_path / name
        path.write_text(json.dumps(doc))
        return path
    return write


@pytest.fixture
def run_quietly():
    """``gpufio run PROFILE -q`` through the CLI, in process: its result (exit code, stdout,
    stderr)."""
    from typer.testing import CliRunner

    from gpufio.cli import app

    return lambda path: CliRunner().invoke(app, ["run", str(path), "-q"])


@pytest.fixture
def plan_holds_pattern():
    """Check a checkpoint's files byte for byte: each extent of a layout's plan holds the
    pattern of ``seed`` (the round that wrote last) at its own offsets."""
    def check(plan, seed: int) -> None:
        for e in plan.extents:
            with open(plan.paths[e.file], "rb") as f:
                f.seek(e.offset)
                got = np.frombuffer(f.read(e.nbytes), np.uint64)
            assert np.array_equal(got, pattern.expected_words(seed, e.offset, e.nbytes)), \
                f"{plan.paths[e.file]} at byte {e.offset}"
    return check


class FakeClock:
    """A nanosecond clock that moves only when the test sets ``now``."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    """A clock for what takes one (a pacer, a stall watch): 0 until the test moves ``now``."""
    return FakeClock()


@pytest.fixture
def dead_pid() -> int:
    """A process id no process has (above pid_max's default)."""
    pid = 4_000_000
    while Path(f"/proc/{pid}").exists():
        pid += 1
    return pid


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``gpu`` tests cleanly on machines without a GPU (CI, the developers' machines)."""
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    from gpufio.io.gpu import probe

    count, why = probe()
    if count:
        return
    skip = pytest.mark.skip(reason=f"needs a GPU: {why}")
    for item in gpu_items:
        item.add_marker(skip)


GPU_TEST_LIMIT_S = float(os.environ.get("GPUFIO_GPU_TEST_LIMIT_S", "120"))


@pytest.fixture(autouse=True)
def _gpu_test_deadline(request: pytest.FixtureRequest):
    """A GPU test that hangs (a kernel waiting forever) dumps every thread's stack and ends the
    run after GPU_TEST_LIMIT_S, instead of eating the GPU machine's time to the limit."""
    if "gpu" not in request.keywords:
        yield
        return
    import faulthandler

    faulthandler.dump_traceback_later(GPU_TEST_LIMIT_S, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="session")
def nvme_rig(tmp_path_factory: pytest.TempPathFactory):
    """The NVMe rig's guest (tests/rig.py), booted once for every ``nvme`` test of the run;
    the session's temporary directory is shared with it at the same path."""
    import rig

    why = rig.missing()
    if why:
        pytest.skip(f"needs the NVMe rig: {why}")
    try:
        guest = rig.Rig(tmp_path_factory.mktemp("nvme-rig"), tmp_path_factory.getbasetemp())
    except rig.RigError as e:  # pytest keeps the skip: every nvme test skips, one boot tried
        pytest.skip(f"the NVMe rig did not boot: {e}")
    yield guest
    guest.close()


@pytest.fixture
def torn_on_read_back() -> Callable[[str, int, bytes], ContextManager[None]]:
    """``torn_on_read_back(path, offset, data)``: while it holds, ``data`` is written into
    ``path`` at ``offset`` whenever a job says it is reading back what it wrote, so the
    read-back meets a block that changed after its write."""
    @contextmanager
    def torn(path: str, offset: int, data: bytes) -> Iterator[None]:
        def corrupt(kind: str, text: str) -> None:
            if "reading back" in text:
                with open(path, "r+b") as f:
                    f.seek(offset)
                    f.write(data)

        with events.sink(corrupt):
            yield

    return torn
