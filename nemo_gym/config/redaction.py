"""Hide credentials in a config before it is shown to anyone who can reach a server."""

from __future__ import annotations

import re
from typing import Any

CREDENTIAL_KEY = re.compile(r"secret|api_key|token|password", re.IGNORECASE)
REDACTED = "<redacted>"


def redact(data: Any) -> Any:
    """A copy of ``data`` with the value of every key that names a credential replaced, at any depth."""
    if isinstance(data, dict):
        return {key: REDACTED if CREDENTIAL_KEY.search(str(key)) else redact(value) for key, value in data.items()}
    if isinstance(data, list):
        return [redact(item) for item in data]
    return data
