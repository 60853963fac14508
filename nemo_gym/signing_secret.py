"""The secret that signs a server's cookies and tokens: configured, or made once per instance and kept in a file."""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from pathlib import Path

# Anyone who knows the secret can forge any session; shorter ones are refused, never used.
MIN_SECRET_BYTES = 32


class SecretError(ValueError):
    """A secret that must not be used: empty, shorter than MIN_SECRET_BYTES, or unreadable."""


def state_dir() -> Path:
    """Where per-server state that must outlive a restart (the signing secret) is kept."""
    default = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "nemo_gym"
    return Path(os.environ.get("NEMO_GYM_STATE_DIR", default))


def check_length(secret: str, what: str) -> str:
    size = len(secret.encode())
    if size < MIN_SECRET_BYTES:
        raise SecretError(f"{what} is {size} bytes long; a signing secret needs at least {MIN_SECRET_BYTES}")
    return secret


def session_secret(instance_name: str, configured: str | None = None) -> str:
    """The secret that signs this server's cookies and tokens.

    A configured ``session_secret`` wins. Otherwise a random secret is made once per instance name and
    kept in a 0600 file, so every worker signs with it and a restarted server still accepts (and can
    explain the loss of) the cookies it handed out before.
    """
    if configured is not None:
        return check_length(configured, "the configured session_secret")
    path = state_dir() / "secrets" / instance_name
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not os.path.lexists(path):
        create(path)
    return read(path)


def create(path: Path) -> None:
    """Write a new secret beside ``path`` and link it into place whole.

    A reader never sees the file empty or half written. Of processes that race here, the first link
    wins and the others read the winner's secret.
    """
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as file:
            file.write(secrets.token_urlsafe(32))
            file.flush()
            os.fsync(file.fileno())
        with contextlib.suppress(FileExistsError):
            os.link(temporary, path)
    finally:
        os.unlink(temporary)


def read(path: Path) -> str:
    try:
        return check_length(path.read_text().strip(), f"the session secret file {path}")
    except (OSError, UnicodeDecodeError) as error:
        problem = f"cannot read the session secret file {path} ({error})"
    except SecretError as error:
        problem = str(error)
    raise SecretError(f"{problem}; remove it to have a new one made (sessions signed with the old one are then lost)")
