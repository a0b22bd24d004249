"""The command's entry: ``python -m gpufio`` and the ``gpufio`` console script.

The top-level ``gpufio --help`` prints the text typer renders for it, kept in help.txt
(tests/cli/test_startup.py checks that it is current), without loading typer and the commands;
every other command line goes to gpufio.cli.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HELP = Path(__file__).with_name("help.txt")
# click draws help as wide as the terminal up to 80 columns: help.txt is the 80-column text
WIDTH = 80


def _columns() -> int:
    """The terminal's width as click reads it: COLUMNS, else the terminal's, else 80."""
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return WIDTH


def _program() -> str:
    """The program's name in the usage line, as click names it: ``python -m gpufio`` when run
    as a module, else the script's file name."""
    package = getattr(sys.modules["__main__"], "__package__", None)
    return f"python -m {package}" if package else os.path.basename(sys.argv[0])


def main() -> None:
    """Console-script entry point."""
    if sys.argv[1:] == ["--help"] and _columns() >= WIDTH:
        sys.stdout.write(HELP.read_text().replace("Usage: gpufio ", f"Usage: {_program()} ", 1))
        return
    from gpufio.cli import main as commands

    commands()


if __name__ == "__main__":
    main()
