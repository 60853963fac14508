"""Hide credentials in a config before it is shown to anyone who can reach a server."""

from __future__ import annotations

import re
from typing import Any

CREDENTIAL_KEY = re.compile(r"secret|api_key|token|password", re.IGNORECASE)
REDACTED = "<redacted>"
# A URL's password, in its user part (``scheme://user:password@host``) or as a ``password`` parameter (a
# ``session_store: postgresql://...``, say): the rest of the URL is kept, it says where.
URL_PASSWORD = re.compile(r"(?P<keep>^[A-Za-z][A-Za-z0-9+.-]*://[^/?#@:]*:)[^/?#@]*(?=@)")
PASSWORD_PARAMETER = re.compile(r"(?P<keep>[?&]password=)[^&#]*", re.IGNORECASE)


def redact(data: Any) -> Any:
    """A copy of ``data`` with the value of every key that names a credential replaced, and every URL's
    password, at any depth."""
    if isinstance(data, dict):
        return {key: REDACTED if CREDENTIAL_KEY.search(str(key)) else redact(value) for key, value in data.items()}
    if isinstance(data, list):
        return [redact(item) for item in data]
    if isinstance(data, str) and "://" in data:
        return PASSWORD_PARAMETER.sub(rf"\g<keep>{REDACTED}", URL_PASSWORD.sub(rf"\g<keep>{REDACTED}", data))
    return data
