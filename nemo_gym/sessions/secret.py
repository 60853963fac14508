"""The secret that signs a server's cookies and tokens: configured, or made once per instance and kept in a file."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import tempfile
from pathlib import Path

from nemo_gym.env import STATE_DIR_ENV

# Anyone who knows the secret can forge any session; shorter ones are refused, never used.
MIN_SECRET_BYTES = 32
# What an instance's signing key is derived for, before the instance's name (the replicas' credentials have a context of their own).
SIGNING_KEY_CONTEXT = b"nemo-gym session signing v1\0"


class SecretError(ValueError):
    """A secret that must not be used: empty, shorter than MIN_SECRET_BYTES, unreadable, or not private."""


def state_dir() -> Path:
    """Where per-server state that must outlive a restart (the signing secret) is kept."""
    default = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "nemo_gym"
    return Path(os.environ.get(STATE_DIR_ENV, default))


def check_length(secret: str, what: str) -> str:
    size = len(secret.encode())
    if size < MIN_SECRET_BYTES:
        raise SecretError(f"{what} is {size} bytes long; a signing secret needs at least {MIN_SECRET_BYTES}")
    return secret


def session_secret(instance_name: str, configured: str | None = None) -> str:
    """The secret that signs this server's cookies and tokens.

    A configured ``session_secret`` wins. Otherwise a random secret is made once per instance name and
    kept in a 0600 file, so every worker signs with it and a restarted server still accepts (and can
    explain the loss of) the cookies it handed out before. As ssh does with a private key, the file and
    its directory must be this user's, the directory writable by no one else and the file readable by
    no one else: a secret another user could plant or read would let them forge any session.
    """
    if configured is not None:
        return check_length(configured, "the configured session_secret")
    path = state_dir() / "secrets" / instance_name
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    check_private(os.stat(path.parent), f"the session secret directory {path.parent}", 0o022, "can be written by other users")
    if not os.path.lexists(path):
        create(path)
    return read(path)


def instance_key(secret: str, instance_name: str) -> str:
    """The key that signs an instance's session cookies and MCP tokens: HMAC-SHA256 of its name under its secret.

    Two instances configured with the same ``session_secret`` value sign apart: what one minted does not verify
    at the other, which then neither serves the session nor forwards it to the owner (its cookie or token is as
    none). The replicas of one instance (one name, one secret) share it.
    """
    return hmac.new(secret.encode(), SIGNING_KEY_CONTEXT + instance_name.encode(), hashlib.sha256).hexdigest()


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


def check_private(status: os.stat_result, what: str, others_bits: int, others_can: str) -> None:
    """Refuse what another user owns, or what others can reach through ``others_bits`` of its mode."""
    if status.st_uid != os.geteuid():
        raise SecretError(
            f"{what} is owned by uid {status.st_uid}, not by this server's user (uid {os.geteuid()}): another user "
            "could have planted it; remove it (a new secret is then made), or chown it to this user if you made it"
        )
    if status.st_mode & others_bits:
        raise SecretError(
            f"{what} {others_can} (mode {status.st_mode & 0o7777:04o}): anyone who can plant or read a secret can "
            "forge sessions; remove it (a new secret is then made), or chmod it (700 for the directory, 600 for the "
            "file) if nobody else has touched it"
        )


def read(path: Path) -> str:
    try:
        with open(path, "rb") as file:
            check_private(os.fstat(file.fileno()), f"the session secret file {path}", 0o077, "can be read or written by other users")
            text = file.read().decode()
    except (OSError, UnicodeDecodeError) as error:
        problem = f"cannot read the session secret file {path} ({error})"
    else:
        try:
            return check_length(text.strip(), f"the session secret file {path}")
        except SecretError as error:
            problem = str(error)
    raise SecretError(f"{problem}; remove it to have a new one made (sessions signed with the old one are then lost)")
