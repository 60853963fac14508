"""A replica's forwarding port and the forwarder that signs for it: two readers of one request must agree.

The forwarder (``Exchange``, with a replica's signer) writes a request and its credential; a real uvicorn
with the forwarding port's protocol (``ReplicaPortProtocol``) and guard (``BodyChecked``) parses it and
checks the credential against what it read. Whatever session headers and body a caller's request
brings, in however many pieces, the port must admit the forward as written, and refuse it when the
credential was made for other session headers or another body.

A credential is refused outside its time window and for any method, target, replica, worker, session or body other
than the ones it was made for.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_gym.config import free_port
from nemo_gym.protocols.input_limits import InputLimits
from nemo_gym.routing.exchange import Exchange
from nemo_gym.routing.transport.connection import OwnerConnection
from nemo_gym.routing.transport.credentials import ReplicaCredentials
from nemo_gym.routing.transport.replica_port import REPLICA_WORKER_SCOPE_KEY, BodyChecked, Doorkeeper, ReplicaPortProtocol
from nemo_gym.sessions.token import TOKEN_HEADER, TOKEN_HEADER_KEY
from tests.unit_tests.in_process_server import serving_in_a_thread

REPLICA = "127.0.0.1:1"
WORKER = "0123456789abcdef"
CREDENTIALS = ReplicaCredentials("s" * 40)


async def echo(scope, receive, send) -> None:
    """What the app got: the worker the credential named, and the body."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    reply = json.dumps({"worker": scope[REPLICA_WORKER_SCOPE_KEY], "body": body.decode("latin-1")}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(reply))]})
    await send({"type": "http.response.body", "body": reply})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    """A forwarding port (its protocol and guard) in front of ``echo``, in a thread of its own."""
    protocol = functools.partial(ReplicaPortProtocol, doorkeeper=Doorkeeper(CREDENTIALS, REPLICA), limits=InputLimits().for_replicas())
    with serving_in_a_thread(BodyChecked(echo), free_port(), http=protocol) as port:
        yield port


# Header values as a public port hands them on: no surrounding whitespace, no control characters.
values = st.text(st.characters(codec="latin-1", exclude_categories=("Cc",)), min_size=1, max_size=60).map(str.strip).filter(bool)
session_headers = st.lists(st.tuples(st.sampled_from([b"cookie", TOKEN_HEADER_KEY]), values.map(lambda value: value.encode("latin-1"))), max_size=3)
bodies = st.lists(st.binary(max_size=2000), min_size=1, max_size=4)


async def forwarded(port: int, headers: list[tuple[bytes, bytes]], pieces: list[bytes], sign) -> tuple[int, dict]:
    """The status and reply of a POST with ``headers`` and a body in ``pieces``, forwarded to the port signed by ``sign``."""
    scope = {"type": "http", "method": "POST", "path": "/a b", "raw_path": b"/a%20b", "query_string": b"q=1", "client": ("10.0.0.9", 5)}
    scope["headers"] = [*headers, (b"content-length", b"%d" % sum(map(len, pieces)))]
    messages = [{"type": "http.request", "body": piece, "more_body": index < len(pieces) - 1} for index, piece in enumerate(pieces)]
    sent = []

    async def receive():
        if messages:
            return messages.pop(0)
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    _, connection = await asyncio.get_running_loop().create_connection(OwnerConnection, "127.0.0.1", port)
    try:
        async with asyncio.timeout(30):
            exchange = Exchange(scope, receive, send, sign)
            await exchange.run(lambda body: exchange.relay(connection, body))
    finally:
        connection.close()
    body = b"".join(message.get("body", b"") for message in sent[1:])
    return sent[0]["status"], json.loads(body)


def signer(headers_for=lambda headers: headers, body_for=lambda body: body):
    """The replica's stamp (``Exchange``'s), made for the headers and body these give instead of those sent."""

    def sign(scope, headers, body):
        headers.append(CREDENTIALS.header(b"POST", b"/a%20b?q=1", REPLICA, WORKER, headers_for(headers), body_for(body)))

    return sign


@settings(max_examples=60, deadline=None)
@given(headers=session_headers, pieces=bodies)
def test_the_forwarding_port_admits_a_forward_as_signed_and_refuses_one_signed_for_other_session_headers_or_another_body(port, headers, pieces):
    status, reply = asyncio.run(forwarded(port, headers, pieces, signer()))
    assert (status, reply) == (200, {"worker": WORKER, "body": b"".join(pieces).decode("latin-1")})
    another_session = signer(headers_for=lambda sent: [*sent, (b"cookie", b"s=other")])
    assert asyncio.run(forwarded(port, headers, pieces, another_session))[0] == 401
    whole = b"".join(pieces)
    same_length = bytes([whole[0] ^ 1]) + whole[1:] if whole else b"x"
    assert asyncio.run(forwarded(port, headers, pieces, signer(body_for=lambda body: [same_length])))[0] == 401


@pytest.mark.anyio
async def test_replica_credentials_are_refused_outside_their_window_and_for_anything_they_were_not_made_for():
    credentials = ReplicaCredentials("x" * 40, window_seconds=10)
    headers = [(b"cookie", b"s=1"), (b"x-other", b"a")]
    _, value = credentials.header(b"GET", b"/a?b=1", "h:1", "d" * 16, headers, [b"bo", b"dy"])
    digest = hashlib.sha256(b"body").hexdigest()
    assert credentials.admit(value, b"GET", b"/a?b=1", "h:1", headers, 4) == ("d" * 16, digest)
    # Headers that do not name the session are not covered; those that do are, in order.
    assert credentials.admit(value, b"GET", b"/a?b=1", "h:1", [(b"cookie", b"s=1")], 4) == ("d" * 16, digest)
    assert credentials.admit(value, b"GET", b"/a?b=2", "h:1", headers, 4) is None
    assert credentials.admit(value, b"POST", b"/a?b=1", "h:1", headers, 4) is None
    assert credentials.admit(value, b"GET", b"/a?b=1", "h:2", headers, 4) is None
    assert credentials.admit(value, b"GET", b"/a?b=1", "h:1", headers, 5) is None
    assert credentials.admit(value, b"GET", b"/a?b=1", "h:1", [(b"cookie", b"s=2")], 4) is None
    assert credentials.admit(value, b"GET", b"/a?b=1", "h:1", [*headers, (TOKEN_HEADER.lower().encode(), b"t")], 4) is None
    assert credentials.admit(value, b"GET", b"/a?b=1", "h:1", [(b"cookie", b"s=1"), (b"cookie", b"t=1")], 4) is None
    assert ReplicaCredentials("y" * 40).admit(value, b"GET", b"/a?b=1", "h:1", headers, 4) is None
    stamp, worker, _, mac = value.decode().split()
    assert credentials.admit(f"{stamp} {'e' * 16} {digest} {mac}".encode(), b"GET", b"/a?b=1", "h:1", headers, 4) is None
    other = hashlib.sha256(b"bodx").hexdigest()
    assert credentials.admit(f"{stamp} {worker} {other} {mac}".encode(), b"GET", b"/a?b=1", "h:1", headers, 4) is None
    _, late = credentials.header(b"GET", b"/a?b=1", "h:1", worker, headers, [b"body"], int(stamp) - 11)
    assert credentials.admit(late, b"GET", b"/a?b=1", "h:1", headers, 4) is None
