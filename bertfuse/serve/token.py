"""The bearer token of `bertfuse serve`: read once, before Ray starts, from its file or the
environment, and kept only as its SHA-256. No Ray here.

    --token-file FILE ─► refused when group or others may read or write it (exit 2), unless
                         allowed (allow_readable_token_file) ─► its one line
    else BERTFUSE_TOKEN ─► the same checks of the value
    ─► token_digest (what the replicas keep: the deployment's config carries it, and the
       HTTP guards in front of them: HAProxy's config, the uvicorn protocol's flag)

withheld(): BERTFUSE_TOKEN out of this process's environment while deploy() runs what it
starts (Ray's processes, HAProxy, the watchdog all inherit the environment: before, each of
the 14 processes of a local serve held the token in /proc/PID/environ), put back when the
service shuts down, so that a later deploy() in the same process reads it again.
"""

from __future__ import annotations

import os
import stat

from bertfuse.runtime.request_checks import ConfigError
from bertfuse.serve.guard import token_digest

TOKEN_ENV = "BERTFUSE_TOKEN"
MAX_TOKEN = 4096
# Variables of bertfuse's that hold a secret: none of the processes deploy() starts gets them
SECRET_ENV = (TOKEN_ENV,)
ALLOW_FLAG = "--allow-readable-token-file"


def token_sha256(path: str | None, allow_readable: bool = False) -> str | None:
    """The digest of the bearer token in `path` (or BERTFUSE_TOKEN), None for no token."""
    if path is None:
        token = os.environ.get(TOKEN_ENV)
        if token is None:
            return None
        where = f"the environment's {TOKEN_ENV}"
    else:
        where = path
        token = _read(path, allow_readable)
    token = token.strip()
    if not token or len(token) > MAX_TOKEN or not token.isascii() or not token.isprintable() \
            or " " in token:
        raise ConfigError(f"{where}: the token must be 1..{MAX_TOKEN} printable ASCII "
                          "characters without spaces")
    return token_digest(token)


def _read(path: str, allow_readable: bool) -> str:
    """The file's text, after its mode is checked on the open file (not on a name that could
    be swapped between the check and the read)."""
    try:
        with open(path, encoding="utf-8") as f:
            mode = os.fstat(f.fileno()).st_mode
            if stat.S_ISREG(mode) and mode & 0o077 and not allow_readable:
                raise ConfigError(
                    f"token_file {path}: mode {stat.S_IMODE(mode):04o} lets other users "
                    f"read or change the token; chmod 600 {path} (or {ALLOW_FLAG})")
            return f.read(MAX_TOKEN + 2)
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or "not UTF-8 text"
        raise ConfigError(f"token_file {path}: cannot read it ({why})") from None


def withhold() -> dict[str, str]:
    """Removes SECRET_ENV from this process's environment; returns what was there."""
    return {k: os.environ.pop(k) for k in SECRET_ENV if k in os.environ}


def restore(saved: dict[str, str]) -> None:
    """Puts back what withhold() took (a value set meanwhile stays)."""
    for k, v in saved.items():
        os.environ.setdefault(k, v)
