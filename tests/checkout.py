"""The checkout under test's folders, for tests at any depth below tests/ (a test finds the
repository from here, never by counting its own parents)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
DATA = TESTS / "data"
PROFILES = REPO / "profiles"
