"""gpu.PinnedBuffer without a GPU: page-locking and its undoing are paired on every path."""

import mmap

import pytest

from gpufio.io import gpu


def test_close_unregisters_once_and_the_memory_is_page_aligned(monkeypatch):
    registered, unregistered = [], []
    monkeypatch.setattr(gpu, "register_host",
                        lambda addr, size, mapped=False: registered.append((addr, size, mapped)))
    monkeypatch.setattr(gpu, "unregister_host", unregistered.append)
    buf = gpu.PinnedBuffer(5000, mapped=True)
    addr = buf.addr
    assert registered == [(addr, len(buf.array), True)]
    assert addr % mmap.PAGESIZE == 0 and len(buf.array) == 5000
    buf.array[:5000] = 7
    buf.close()
    buf.close()
    assert unregistered == [addr] and buf.array is None


def test_a_refused_registration_unregisters_nothing(monkeypatch):
    def refuse(addr, size, mapped=False):
        raise RuntimeError("cudaErrorHostMemoryAlreadyRegistered")

    unregistered = []
    monkeypatch.setattr(gpu, "register_host", refuse)
    monkeypatch.setattr(gpu, "unregister_host", unregistered.append)
    with pytest.raises(RuntimeError, match="AlreadyRegistered"):
        gpu.PinnedBuffer(4096)
    assert unregistered == []
