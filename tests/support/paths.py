"""The folders tests read: the repository's root, ``tests/`` and ``tests/data``."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
DATA = TESTS / "data"
