"""The one I/O primitive (core/requests): every engine's channel moves the bytes asked of
it, at the offsets asked, both ways, and names the request that failed."""

from __future__ import annotations

import os

import numpy as np
import pytest

from gpufio.core.requests import HOST, ChannelSpec, RequestFailed
from gpufio.loops.steps import move_all
from gpufio.engines import all_engines


def _job(engine: str = "psync"):
    from gpufio.profile import from_dict

    return from_dict({"job": [{"name": "t", "size": "1m", "engine": engine}]}, "t.toml",
                     {}).jobs[0]


# (channels over NVMe namespaces only, as uring-cmd's, need the rig: tests/engines/test_uring_cmd_rig.py)
HOST_CHANNELS = [name for name, cls in all_engines().items()
                 if cls.capability is not None and HOST in cls.capability.memory
                 and cls.capability.moves_data
                 and cls.host_unavailable() is None and not cls.generic_targets(_job(name))]


class _File:
    def __init__(self, path: str, fd: int) -> None:
        self.path, self.fd = path, fd


@pytest.fixture
def two_files(tmp_path):
    files = []
    for i in range(2):
        p = tmp_path / f"f{i}"
        p.write_bytes(bytes((i * 7 + b) % 251 for b in range(1 << 16)))
        files.append(_File(str(p), os.open(p, os.O_RDWR)))
    yield files
    for f in files:
        os.close(f.fd)


@pytest.mark.parametrize("engine", HOST_CHANNELS)
def test_a_channel_reads_the_bytes_of_each_file_at_each_offset(engine, two_files):
    cls = all_engines()[engine]
    ch = cls.channel(_job(engine), two_files, ChannelSpec(depth=4))
    n = 9
    tgt = np.arange(n) % 2
    off = np.arange(n, dtype=np.int64) * 4096 + 512 * (np.arange(n) % 3)
    buf = np.zeros((n, 4096), np.uint8)
    addr = buf.ctypes.data + np.arange(n, dtype=np.uint64) * 4096
    try:
        assert move_all(ch, tgt, off, np.full(n, 4096), addr, False) > 0
    finally:
        ch.close()
    for i in range(n):
        want = open(two_files[tgt[i]].path, "rb").read()[off[i]:off[i] + 4096]
        assert bytes(buf[i]) == want


@pytest.mark.parametrize("engine", HOST_CHANNELS)
def test_a_channel_writes_what_it_is_given_and_names_a_short_read(engine, two_files):
    cls = all_engines()[engine]
    ch = cls.channel(_job(engine), two_files, ChannelSpec(depth=2, writes=True))
    src = np.full((3, 4096), 0xAB, np.uint8)
    addr = src.ctypes.data + np.arange(3, dtype=np.uint64) * 4096
    try:
        move_all(ch, [1, 1, 0], [0, 8192, 4096], [4096] * 3, addr, True)
        with pytest.raises(RequestFailed) as e:
            move_all(ch, [0, 1], [0, (1 << 16) - 100], [4096, 4096], addr, False)
    finally:
        ch.close()
    assert e.value.index == 1 and e.value.res == 100
    data = open(two_files[1].path, "rb").read()
    assert data[:4096] == b"\xab" * 4096 and data[8192:12288] == b"\xab" * 4096
    assert open(two_files[0].path, "rb").read()[4096:8192] == b"\xab" * 4096


def test_the_null_channel_completes_every_request_with_its_bytes_and_moves_none(two_files):
    ch = all_engines()["null"].channel(_job("null"), two_files, ChannelSpec(depth=3))
    buf = np.zeros(4096 * 5, np.uint8)
    addr = buf.ctypes.data + np.arange(5, dtype=np.uint64) * 4096
    assert move_all(ch, [0] * 5, np.arange(5) * 4096, [4096] * 5, addr, False) > 0
    assert not buf.any() and ch.inflight == 0
