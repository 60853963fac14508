"""Hide credentials before anything is shown to anyone: a config dumped or served, a log line, an error.

A key that names a credential has its value replaced. A URL is never shown as written: it is read the
way libpq reads a ``postgresql://`` location (its user part ends at the first ``@`` that comes before
any ``/``, so a password may hold a raw ``?``, ``#`` or ``:``; parameters run to the next ``&``, with no
fragment), and shown rebuilt from its parts without the password and without any parameter that names
a credential. A URL that holds an ``@`` after its user part cannot be read one way only (a password
with a raw ``@`` or ``/``: libpq takes part of it for the host or the database), so it is shown as its
scheme alone, and a store refuses it (``misread``).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any
from urllib.parse import unquote

CREDENTIAL_KEY = re.compile(r"secret|api_key|token|password", re.IGNORECASE)
REDACTED = "<redacted>"


@dataclasses.dataclass(frozen=True)
class Url:
    """A URL's parts as written (nothing decoded), read with libpq's rules."""

    scheme: str
    user: str | None
    password: str | None
    # Host and port (or several, comma-separated), then the path (a database) and the parameters.
    where: str
    path: str | None
    parameters: tuple[tuple[str, str], ...]


def parse_url(url: str) -> Url | None:
    """``url``'s parts; None for a string that is not ``scheme://...``."""
    scheme, separator, rest = url.partition("://")
    if not separator or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme):
        return None
    user = password = None
    end = min((index for index in (rest.find("@"), rest.find("/")) if index >= 0), default=-1)
    if end >= 0 and rest[end] == "@":
        credentials, rest = rest[:end], rest[end + 1 :]
        user, colon, written = credentials.partition(":")
        password = written if colon else None
    rest, question, query = rest.partition("?")
    where, slash, path = rest.partition("/")
    parameters = tuple(item.partition("=")[::2] for item in query.split("&") if item) if question else ()
    return Url(scheme, user, password, where, path if slash else None, parameters)


def secret_parts(url: str) -> list[str]:
    """Every credential ``url`` carries (its password, and each parameter that names one), as written and
    decoded, longest first: what no text shown about it may contain."""
    parts = parse_url(url)
    if parts is None:
        return []
    written = [value for name, value in parts.parameters if CREDENTIAL_KEY.search(unquote(name))]
    if parts.password:
        written.append(parts.password)
    return sorted({form for value in written for form in (value, unquote(value)) if form}, key=len, reverse=True)


def misread(url: str) -> bool:
    """Whether ``url`` holds an ``@`` past its user part: a user or password whose ``@`` or ``/`` is not
    percent-encoded (``%40``, ``%2F``), which libpq would read in part as a host, database or parameter."""
    parts = parse_url(url)
    if parts is None:
        return False
    return "@" in parts.where or "@" in (parts.path or "") or any("@" in name + value for name, value in parts.parameters)


def shown_url(url: str) -> str:
    """``url`` as it may be shown: rebuilt without its password and credential parameters; a URL that
    cannot be read one way only, as its scheme alone."""
    parts = parse_url(url)
    if parts is None:
        return url
    if misread(url):
        return f"{parts.scheme}://{REDACTED}"
    user = f"{parts.user}@" if parts.user is not None else ""
    path = f"/{parts.path}" if parts.path is not None else ""
    kept = [f"{name}={value}" for name, value in parts.parameters if not CREDENTIAL_KEY.search(unquote(name))]
    query = f"?{'&'.join(kept)}" if kept else ""
    return f"{parts.scheme}://{user}{parts.where}{path}{query}"


def scrubbed(text: str, url: str) -> str:
    """``text`` (a driver's error about ``url``, say) with every credential of ``url`` in it replaced."""
    for secret in secret_parts(url):
        text = text.replace(secret, REDACTED)
    return text


def redact(data: Any) -> Any:
    """A copy of ``data`` with the value of every key that names a credential replaced, and every URL
    shown without its credentials, at any depth."""
    if isinstance(data, dict):
        return {key: REDACTED if CREDENTIAL_KEY.search(str(key)) else redact(value) for key, value in data.items()}
    if isinstance(data, list):
        return [redact(item) for item in data]
    if isinstance(data, str) and "://" in data:
        return shown_url(data)
    return data
