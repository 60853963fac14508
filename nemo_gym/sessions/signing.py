"""What signs an instance's sessions, as a server reads it: its secret, the key derived from it for the
instance, the MCP tokens' serializer, the cookie's name and the session layer's settings.

A mixin of ``nemo_gym.server.SimpleServer``, which gives it ``name`` and ``config.session_secret``.
"""

from __future__ import annotations

import functools
import secrets
from typing import Any

from itsdangerous import URLSafeSerializer

from nemo_gym.sessions.cookie import session_cookie_name
from nemo_gym.sessions.secret import instance_key, session_secret
from nemo_gym.sessions.token import token_serializer


class SessionSigning:
    """Reads ``self.name`` and ``self.config.session_secret`` (no annotations here: pydantic would take them for fields)."""

    @functools.cached_property
    def secret(self) -> str:
        if not self.name and self.config.session_secret is None:
            # No instance to share a secret with (upstream's tests build servers named ""): this object's own.
            return secrets.token_urlsafe(32)
        return session_secret(self.name, self.config.session_secret)

    @functools.cached_property
    def signing_key(self) -> str:
        """What signs this instance's session cookies and MCP tokens: derived from the secret and the instance's
        name (``instance_key``), so an instance whose secret has the same value signs apart."""
        return instance_key(self.secret, self.name)

    @functools.cached_property
    def tokens(self) -> URLSafeSerializer:
        """The MCP session tokens' serializer (``sessions.token``), under this instance's signing key."""
        return token_serializer(self.signing_key)

    @property
    def session_cookie(self) -> str:
        return session_cookie_name(self.name)

    @property
    def session_options(self) -> dict[str, Any]:
        """The session layer's settings: the app's, and the router's reading of the same cookie."""
        return {"secret_key": self.signing_key, "session_cookie": self.session_cookie}
