"""What the lower bands have to tell the user while they work (a file being laid out, advice
before a job), as events: code below the CLI emits them and never prints; the sink decides
where they go (stderr by default, nowhere under --quiet, a list in tests)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# (kind, one line of text) -> None; kinds: "layout", "advice", "warning", "progress", "eta"
Sink = Callable[[str, str], None]


def _stderr(kind: str, text: str) -> None:
    print(text, file=sys.stderr, flush=True)


_sink: Sink = _stderr


def emit(kind: str, text: str) -> None:
    """Hand one line to the current sink."""
    _sink(kind, text)


@contextmanager
def sink(new: Sink) -> Iterator[None]:
    """Send events to ``new`` for the duration of the block."""
    global _sink
    previous, _sink = _sink, new
    try:
        yield
    finally:
        _sink = previous
