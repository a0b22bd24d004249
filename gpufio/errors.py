"""The failure the CLI maps to its bad-input exit code.

Bad input (exit 2) is the user's to fix and gets one line naming what is wrong. Keeping it
one exception type lets every layer raise it without knowing about exit codes. A run that
fails (exit 1) is not an exception: its result says what went wrong (I/O errors, bad data,
an engine failure), and the CLI reads the verdict from there.
"""


class BadInput(Exception):
    """A profile, option, target or environment the job cannot run with (exit code 2)."""
