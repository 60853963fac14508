"""The MCP session token: a signed payload naming a session (and, with several workers, its owner and its replica).

CLI harnesses in sandboxes keep only this token, minted at ``/seed_session``, and send it in the
``X-NeMo-Gym-Session-Token`` header instead of a session cookie.
"""

from __future__ import annotations

from typing import Any

from itsdangerous import BadSignature, URLSafeSerializer

from nemo_gym import SESSION_ID_KEY
from nemo_gym.sessions.worker import OWNER_KEY

TOKEN_HEADER = "X-NeMo-Gym-Session-Token"
TOKEN_HEADER_KEY = TOKEN_HEADER.lower().encode()  # as the header's name is in an ASGI scope
TOKEN_SALT = "nemo-gym-mcp-session-token"
# The MCP endpoint, where a request's token names its session before any cookie does.
MCP_PATH = "/mcp"


def is_mcp_path(path: str) -> bool:
    return path == MCP_PATH or path.startswith(MCP_PATH + "/")


def token_serializer(secret: str) -> URLSafeSerializer:
    return URLSafeSerializer(secret, salt=TOKEN_SALT)


def mint_token(serializer: URLSafeSerializer, session_id: str, owner: str | None, replica: dict[str, Any] | None = None) -> str:
    """The token of a session, naming its owner (and, in a replica set, the owner's replica) if it has one."""
    payload: dict[str, Any] = {SESSION_ID_KEY: session_id}
    if owner is not None:
        payload[OWNER_KEY] = owner
        if replica is not None:
            payload.update(replica)
    return serializer.dumps(payload)


def read_token(serializer: URLSafeSerializer, token: str) -> dict[str, Any] | None:
    """The token's payload, or None when the signature is bad or the payload is not a session."""
    try:
        payload = serializer.loads(token)
    except BadSignature:
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get(SESSION_ID_KEY), str):
        return None
    return payload


def token_session_id(scope: dict[str, Any], serializer: URLSafeSerializer) -> str | None:
    """The session of an ASGI request's token (its first token header, as the MCP endpoint reads it), or None."""
    token = next((value for name, value in scope["headers"] if name == TOKEN_HEADER_KEY), None)
    payload = None if token is None else read_token(serializer, token.decode("latin-1"))
    return None if payload is None else payload[SESSION_ID_KEY]
