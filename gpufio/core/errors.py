"""The failures the CLI maps to its exit codes.

Bad input (exit 2) is the user's to fix and gets one line naming what is wrong. Keeping it
one exception type lets every layer raise it without knowing about exit codes. A run that
fails (exit 1) is usually not an exception: its result says what went wrong (I/O errors, bad
data, an engine failure), and the CLI reads the verdict from there. Only a run that leaves no
result to read (a rank of an MPI run failed or went silent) raises RunFailed.
"""


from collections.abc import Iterator
from contextlib import contextmanager


class BadInput(Exception):
    """A profile, option, target or environment the job cannot run with (exit code 2)."""


class RunFailed(Exception):
    """A run that ended without a result to report (exit code 1); the text says why."""


class WorkerHung(RunFailed):
    """A worker that will not stop: a call that never returns (a library stuck inside). The
    process must end without waiting for it, and without the libraries' exit handlers,
    which would wait for that very call."""


@contextmanager
def reading(path: str, what: str) -> Iterator[None]:
    """Turn the ways opening or decoding an input file fails into one-line BadInput errors."""
    try:
        yield
    except FileNotFoundError:
        raise BadInput(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise BadInput(f"{path}: is a directory, not a {what}") from None
    except OSError as e:
        raise BadInput(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise BadInput(f"{path}: not UTF-8 text{_encoding_hint(e.object)} (byte {e.start}); "
                       f"a {what} must be UTF-8") from None


def _encoding_hint(data: bytes | bytearray) -> str:
    """What the bytes look like instead, for the message."""
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return ": it is UTF-16 (a byte-order mark starts it)"
    if b"\0" in data[:4096]:
        return ": it holds NUL bytes, so it is binary or UTF-16/32"
    return ""
