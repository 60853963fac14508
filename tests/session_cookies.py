"""Session cookies as tests read and make them: with the instance's signing key (``instance_key`` of its secret and
name, a server's ``signing_key``), signed as Starlette signs them."""

from __future__ import annotations

import json
from base64 import b64decode, b64encode
from collections.abc import Mapping
from typing import Any

from itsdangerous import TimestampSigner

from nemo_gym.sessions.worker import OWNER_KEY
from nemo_gym.sessions.cookie import session_cookie_name
from nemo_gym.sessions.secret import instance_key, session_secret


def session_of(key: str, cookie: str) -> dict[str, Any]:
    """The contents of a session cookie, read with the instance's signing key."""
    return json.loads(b64decode(TimestampSigner(key).unsign(cookie)))


def signed_session(key: str, session: dict[str, Any]) -> str:
    """A session cookie with the given contents, signed as Starlette signs it."""
    return TimestampSigner(key).sign(b64encode(json.dumps(session).encode())).decode()


def cookie_owner(cookies: Mapping[str, str], instance: str, secret: str | None = None) -> str | None:
    """The owner worker that the session cookie of ``instance`` among ``cookies`` names (None without one).

    Read with the key of ``secret``, or else of the secret the instance made for itself (in ``NEMO_GYM_STATE_DIR``)."""
    cookie = cookies.get(session_cookie_name(instance))
    return None if cookie is None else session_of(instance_key(secret or session_secret(instance), instance), cookie).get(OWNER_KEY)
