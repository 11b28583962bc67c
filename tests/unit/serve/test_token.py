"""serve/token.py without Ray: the environment's token is read, then withheld from what the
process starts and put back after (a later deploy() in the same process reads it again)."""

from __future__ import annotations

import os
import subprocess
import sys

from bertfuse.serve.guard import token_digest
from bertfuse.serve.token import TOKEN_ENV, restore, token_sha256, withhold


def test_the_token_is_withheld_from_children_and_put_back(monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "env-token")
    assert token_sha256(None) == token_digest("env-token")
    saved = withhold()
    try:
        code = f"import os; print(os.environ.get({TOKEN_ENV!r}))"
        child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               check=True)
        assert child.stdout.strip() == "None" and token_sha256(None) is None
    finally:
        restore(saved)
    assert os.environ[TOKEN_ENV] == "env-token"
    monkeypatch.setenv(TOKEN_ENV, "newer")  # set meanwhile: kept
    restore(saved)
    assert os.environ[TOKEN_ENV] == "newer"
