"""Where things are, for every test wherever it sits in the tree."""

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
FIXTURES = TESTS / "fixtures"
GOLDEN = FIXTURES / "golden"
