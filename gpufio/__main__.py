"""Allows ``python -m gpufio`` where the console script is not on PATH."""

from gpufio.cli import main

main()
