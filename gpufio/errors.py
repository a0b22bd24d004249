"""The two kinds of failure the CLI maps to exit codes.

Bad input (exit 2) is the user's to fix and gets one line naming what is wrong; a run
failure (exit 1) means the measurement itself went wrong (I/O errors, data mismatches).
Keeping them as distinct types lets every layer raise without knowing about exit codes.
"""


class BadInput(Exception):
    """A profile, option, target or environment the job cannot run with (exit code 2)."""


class RunFailed(Exception):
    """A job started but could not produce trustworthy numbers (exit code 1)."""
