"""Reading a request's owner worker from its signed session cookie or its MCP session token."""

from __future__ import annotations

import json
from base64 import b64decode

from itsdangerous import BadSignature, TimestampSigner
from itsdangerous import URLSafeSerializer
from starlette.types import Scope

from nemo_gym.routing.worker import OWNER_KEY
from nemo_gym.session_token import TOKEN_HEADER, read_token

SESSION_MAX_AGE = 14 * 24 * 60 * 60  # Starlette SessionMiddleware's default, which the servers use
MCP_PATH = "/mcp"
TOKEN_HEADER_KEY = TOKEN_HEADER.lower().encode()


class OwnerReader:
    """Finds the owner a request names, verifying signatures exactly as the server itself would.

    Returns None for a request that names no owner: no cookie or token, a bad signature, or a
    session minted without one. Such requests are handled locally.
    """

    def __init__(self, secret: str, cookie_name: str, token_serializer: URLSafeSerializer) -> None:
        self.signer = TimestampSigner(secret)
        self.cookie_prefix = f"{cookie_name}="
        self.token_serializer = token_serializer

    def owner(self, scope: Scope) -> object | None:
        cookie = token = None
        for name, value in scope["headers"]:
            if name == b"cookie":
                cookie = self.session_cookie(value.decode("latin-1")) or cookie
            elif name == TOKEN_HEADER_KEY:
                token = value.decode("latin-1")
        path = scope["path"]
        token_first = path == MCP_PATH or path.startswith(MCP_PATH + "/")
        if token is not None and (token_first or cookie is None):
            return self.token_owner(token)
        if cookie is not None:
            return self.cookie_owner(cookie)
        return None

    def session_cookie(self, header: str) -> str | None:
        for part in header.split(";"):
            part = part.strip()
            if part.startswith(self.cookie_prefix):
                return part[len(self.cookie_prefix):]
        return None

    def cookie_owner(self, cookie: str) -> object | None:
        try:
            data = json.loads(b64decode(self.signer.unsign(cookie, max_age=SESSION_MAX_AGE)))
        except (BadSignature, ValueError):
            return None
        return data.get(OWNER_KEY) if isinstance(data, dict) else None

    def token_owner(self, token: str) -> object | None:
        payload = read_token(self.token_serializer, token)
        return payload.get(OWNER_KEY) if payload else None
