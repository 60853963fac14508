"""The layer that sends a token's request on to the worker the store says holds its session (``routing.to_holder``).

The app behind it stands for the durable layers: it reads the body whole (as the checkpoint gate does) and
names the holder, as the write-through does for a token's session held elsewhere under a live lease. The
forwarders are recorders: what reaches a real holder is the e2e test's
(tests/e2e/hosts/test_shared_store_across_hosts.py, the MCP token session taken over while its owner was frozen).
"""

from __future__ import annotations

import asyncio

import pytest

from nemo_gym.durable.lease import LeaseHolder
from nemo_gym.routing.exchange import replaying
from nemo_gym.routing.forwarder import OwnerBusy, OwnerDied, OwnerGone
from nemo_gym.routing.replica import ReplicaPeer, replica_keys
from nemo_gym.routing.to_holder import HOLDER_SCOPE_KEY, TO_HOLDER_HEADER, ToHolder

HERE = "10.0.0.1:8000"
THERE = "10.0.0.2:8000"
HOLDER = "0123456789abcdef"
BODY = [b'{"jsonrpc": "2.0", ', b'"method": "tools/call"}']


class Recorder:
    """A forwarder that keeps what it was given (the peer, the head, the whole body), or raises ``fails``."""

    def __init__(self, fails: Exception | None = None) -> None:
        self.fails = fails
        self.forwarded: list[tuple] = []

    async def forward(self, peer, scope, receive, send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.forwarded.append((peer, list(scope["headers"]), body))
        if self.fails is not None:
            raise self.fails
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-served-by", b"holder")]})
        await send({"type": "http.response.body", "body": b"held"})


def naming(holder: LeaseHolder | None, seen: list):
    """The app: reads the body whole (as the checkpoint gate does, giving it on whole), notes whether it may name a
    holder, and names ``holder`` with the ``receive`` that gives the body (as the write-through does; None: replies itself)."""

    async def app(scope, receive, send) -> None:
        read = [await receive()]
        while read[-1].get("more_body", False):
            read.append(await receive())
        seen.append(HOLDER_SCOPE_KEY in scope)
        if holder is not None and HOLDER_SCOPE_KEY in scope:
            scope[HOLDER_SCOPE_KEY] = (holder, replaying(receive, *read))
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"here"})

    return app


def called(layer: ToHolder, headers: list[tuple[bytes, bytes]] = ()) -> list[dict]:
    messages = [{"type": "http.request", "body": chunk, "more_body": n < len(BODY) - 1} for n, chunk in enumerate(BODY)]
    sent: list[dict] = []

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": [(b"content-type", b"application/json"), *headers]}
    asyncio.run(layer(scope, receive, send))
    return sent


def holder_at(replica: str) -> LeaseHolder:
    return LeaseHolder(HOLDER, "another-domain", replica_keys(replica, 9000), True)


def test_a_request_whose_session_another_replica_holds_goes_there_with_the_body_the_app_read_and_is_marked_sent_on():
    siblings, replicas, seen = Recorder(), Recorder(), []
    sent = called(ToHolder(naming(holder_at(THERE), seen), siblings, replicas, HERE))
    (peer, headers, body), = replicas.forwarded
    assert (peer, body, siblings.forwarded) == (ReplicaPeer(HOLDER, THERE, "10.0.0.2:9000"), b"".join(BODY), [])
    assert (TO_HOLDER_HEADER, b"1") in headers
    assert [message.get("status") or message.get("body") for message in sent] == [200, b"held"]


def test_a_holder_on_this_host_is_reached_over_the_forwarder_to_the_sibling_workers():
    siblings, replicas, seen = Recorder(), Recorder(), []
    called(ToHolder(naming(holder_at(HERE), seen), siblings, replicas, HERE))
    assert ([peer for peer, _, _ in siblings.forwarded], replicas.forwarded) == ([HOLDER], [])


def test_a_request_the_app_serves_itself_is_not_sent_on():
    siblings, seen = Recorder(), []
    sent = called(ToHolder(naming(None, seen), siblings, None, None))
    assert (seen, siblings.forwarded, sent[-1]["body"]) == ([True], [], b"here")


def test_a_request_sent_on_once_is_never_offered_to_be_sent_on_again():
    siblings, seen = Recorder(), []
    sent = called(ToHolder(naming(holder_at(HERE), seen), siblings, None, HERE), [(TO_HOLDER_HEADER, b"1")])
    assert (seen, siblings.forwarded, sent[-1]["body"]) == ([False], [], b"here")


@pytest.mark.parametrize("fails", [OwnerGone(HOLDER), OwnerBusy(HOLDER)])
def test_a_holder_that_cannot_be_reached_gets_503_with_retry_after_saying_the_request_did_not_take_effect(fails):
    sent = called(ToHolder(naming(holder_at(HERE), []), Recorder(fails), None, HERE))
    assert sent[0]["status"] == 503 and (b"retry-after", b"1") in sent[0]["headers"]
    assert b"did not take effect" in sent[1]["body"]


def test_a_holder_that_died_with_the_request_gets_503_saying_whether_it_took_effect_is_unknown():
    sent = called(ToHolder(naming(holder_at(HERE), []), Recorder(OwnerDied(HOLDER)), None, HERE))
    assert sent[0]["status"] == 503 and b"unknown" in sent[1]["body"]


def test_a_holder_of_another_replica_outside_a_replica_set_gets_503_not_a_forward_to_this_host():
    siblings = Recorder()
    sent = called(ToHolder(naming(holder_at(THERE), []), siblings, None, HERE))
    assert (siblings.forwarded, sent[0]["status"]) == ([], 503)
