"""The model state a checkpoint job saves: its shard sizes, its memory, its contents.

The default shards are the tensors of a Llama-2-7B-shaped model in bf16 (embedding, then per
layer four attention projections, three MLP matrices and two norms, then the final norm and
the output head), narrowed until the embedding, the head and one layer fit ``state_size``,
then as many layers as fit, the last tensor cut to the bytes left. Every shard is padded to
whole 4 KiB blocks (O_DIRECT needs that of each I/O). The state of each iteration carries
gpufio's data pattern of its own seed at the bytes of the files it goes to, so a restore
that returned an earlier iteration's bytes, or another shard's, cannot pass the compare, and
the files carry the pattern header the write guard recognises.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from gpufio.core import pattern
from gpufio.core.targets import aligned_buffer
from gpufio.core.tensors import ALIGN, Extent

# Llama-2-7B: hidden width, MLP width, vocabulary
HIDDEN, MLP, VOCAB = 4096, 11008, 32000
BF16 = 2


def _padded(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def llama_mix(state: int) -> list[int]:
    """Tensor sizes of a Llama-shaped model of about ``state`` bytes (see the module)."""
    h, mlp, vocab = HIDDEN, MLP, VOCAB
    layer = lambda: [h * h * BF16] * 4 + [h * mlp * BF16] * 3 + [h * BF16] * 2  # noqa: E731
    while h > 64 and 2 * vocab * h * BF16 + sum(layer()) > state:
        h, mlp, vocab = h // 2, mlp // 2, vocab // 2
    head = [vocab * h * BF16]
    tail = [h * BF16, vocab * h * BF16]
    return _fill_to(head, layer(), tail, state)


def cycled(sizes: Sequence[int], state: int) -> list[int]:
    """``sizes`` repeated in order until ``state`` bytes, the last one cut to what is left."""
    return _fill_to([], list(sizes), [], state)


def _fill_to(head: list[int], body: list[int], tail: list[int], state: int) -> list[int]:
    """head, then body repeated, then tail, as close to ``state`` bytes as whole 4 KiB shards
    go; a tensor that does not fit is cut to the bytes left."""
    out = [n for n in head if n <= state]
    room = state - sum(map(_padded, out)) - sum(map(_padded, tail))
    if room < 0:  # the tail does not fit: give its space to the body
        tail, room = [], state - sum(map(_padded, out))
    while room >= ALIGN:
        for n in body:
            take = min(_padded(n), room - room % ALIGN)
            if take < ALIGN:
                break
            out.append(take)
            room -= take
    return [_padded(n) for n in out + tail] or [_padded(max(state, 1))]


class State:
    """The shards of one state in host memory (page-aligned, for O_DIRECT) or GPU memory,
    one allocation cut into a view per shard at 4 KiB boundaries."""

    def __init__(self, xp: Any, sizes: Sequence[int]) -> None:
        self.xp = xp
        total = sum(sizes)
        if xp is np:
            self._mem: Any = aligned_buffer(total)
            self.memory = np.frombuffer(self._mem, dtype=np.uint8)[:total]
        else:
            self._mem = None
            self.memory = xp.empty(total, dtype=xp.uint8)
        starts = np.cumsum([0, *sizes[:-1]]).tolist()
        self.tensors = [self.memory[a:a + n] for a, n in zip(starts, sizes)]

    def fill(self, extents: Sequence[Extent], seed: int) -> None:
        """Every shard becomes the pattern of ``seed`` at the file bytes it is saved to."""
        if self.xp is np:
            for t, e in zip(self.tensors, extents):
                pattern.fill_ios(t.reshape(1, -1), np.array([e.offset], np.uint64), seed)
            return
        from gpufio.io import verify

        one = self.xp.zeros(1, dtype=self.xp.uint64)
        seeds = self.xp.full(1, seed, dtype=self.xp.uint64)
        for t, e in zip(self.tensors, extents):
            verify.fill(t.view(self.xp.uint64), one, self.xp.full(1, e.offset, self.xp.uint64),
                        seeds, 1, e.nbytes)
        self.synchronize()

    def clear(self) -> None:
        """Overwrite every byte (no block of zeros passes for the pattern)."""
        self.memory.fill(0)
        self.synchronize()

    def synchronize(self) -> None:
        """Wait for the GPU's work on the state (nothing to wait for in host memory)."""
        if self.xp is not np:
            self.xp.cuda.Device().synchronize()

    def differing(self, other: "State") -> list[tuple[int, int]]:
        """(shard, first differing byte) of each shard whose bytes differ from ``other``'s,
        compared where the state lives (on the GPU for GPU memory)."""
        out = []
        for i, (a, b) in enumerate(zip(self.tensors, other.tensors)):
            if not bool(self.xp.array_equal(a, b)):
                out.append((i, int(self.xp.argmax(a != b))))
        return out

    def close(self) -> None:
        """Free the memory (views first: they point into it)."""
        self.tensors = []
        self.memory = None
        if self._mem is not None:
            self._mem.close()
