"""Sending one request of Gym's own client so that sending it again is safe: its ``Idempotency-Key`` and its retries.

A request whose method may change state (POST, PUT, PATCH, DELETE) carries an ``Idempotency-Key``
header: the caller's if it gave one, else a fresh random id; the same on every attempt. A durable
server stores the key with the session's state and answers a key the session already applied with the
reply it stored (issue 30), so such a request is sent again, with its key, when its connection was cut
before a reply came (the server may or may not have applied it), and after a 503 with ``Retry-After``
in seconds, once that long has passed (a 503 saying the change "may have taken effect" is no
exception: the key makes the retry safe). A GET or HEAD changes nothing and carries no key; it too is
retried after a 503 with ``Retry-After`` (aiohttp itself sends a cut one again once). A refused
connection carried nothing and is retried whatever the method; a request whose body is streamed (``data=``
other than bytes, text or a form mapping) is retried only then. Every other reply, a 503 without
``Retry-After`` or with a date there included, goes to the caller as it came.

These clients keep no cookie jar (callers pass the cookies), so a cookie a 503 sets (the session's
new owner) replaces the caller's cookie of that name on the next attempts, and the reply the caller
gets carries it unless it sets that cookie itself: the caller ends with the cookies a jar would hold.

Bounds, the same for every client path and set here: at most ``MAX_ATTEMPTS`` attempts; no wait longer
than ``MAX_WAIT_SECONDS`` whatever ``Retry-After`` says, and no retry whose wait would take the call's
waiting past ``MAX_WAITING_SECONDS`` (the owner lease a failover waits out is 10 s by default); at most
``MAX_NUM_TRIES`` connections refused or cut, 0.1 s, 0.2 s ... apart. Past a bound the caller gets the
last reply, or the last error.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Mapping
from http.cookies import Morsel
from typing import Any

import aiohttp
from multidict import CIMultiDict

KEY_HEADER = "Idempotency-Key"
CHANGING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
MAX_ATTEMPTS = 20
MAX_WAIT_SECONDS = 30.0
MAX_WAITING_SECONDS = 60.0
# Upstream NeMo Gym's name: how many connections a call may have refused (or, here, cut).
MAX_NUM_TRIES = 3

Attempt = Callable[[dict[str, Any]], Awaitable[aiohttp.ClientResponse]]


async def send(method: str, kwargs: dict[str, Any], attempt: Attempt) -> aiohttp.ClientResponse:
    """``attempt(kwargs)`` (aiohttp's keyword arguments for one ``method`` request), sent again as the module says."""
    changing = method.upper() in CHANGING_METHODS
    # A streamed body (or a file) is gone once sent: such a request is only sent again if it never left.
    replayable = isinstance(kwargs.get("data"), (type(None), bytes, str, Mapping))
    if changing:
        kwargs = with_key(kwargs)
    set_by_503: dict[str, Morsel] = {}
    failures = 0
    waited = 0.0
    for number in range(1, MAX_ATTEMPTS + 1):
        try:
            response = await attempt(kwargs)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as error:
            failures += 1
            if failures >= MAX_NUM_TRIES or number == MAX_ATTEMPTS or not (changing and replayable or isinstance(error, aiohttp.ClientConnectorError)):
                raise
            wait = 0.1 * failures
        else:
            wait = retry_after(response.headers.get("Retry-After")) if response.status == 503 and replayable else None
            if wait is None or number == MAX_ATTEMPTS or waited + wait > MAX_WAITING_SECONDS:
                for name, morsel in set_by_503.items():
                    if name not in response.cookies:
                        response.cookies[name] = morsel
                return response
            set_by_503.update(response.cookies)
            sent = dict(kwargs.get("cookies") or {})
            kwargs = {**kwargs, "cookies": {**sent, **{name: morsel.value for name, morsel in response.cookies.items()}}}
        waited += wait
        await asyncio.sleep(wait)
    raise AssertionError("unreachable")


def with_key(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with an ``Idempotency-Key`` header: the caller's (any spelling), else a fresh random one."""
    headers = CIMultiDict(kwargs.get("headers") or {})
    headers.setdefault(KEY_HEADER, uuid.uuid4().hex)
    return {**kwargs, "headers": headers}


def retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` value in whole seconds (ASCII digits only), capped at ``MAX_WAIT_SECONDS``; None for anything else."""
    if not value or not (value.isascii() and value.isdigit()):
        return None
    return min(float(value), MAX_WAIT_SECONDS)
