"""nemo_gym.routing.transport.connection: the one pool of connections every transport keeps; an owner's reply read
the same however it arrives in pieces (property-based); the request head as the caller sent it; a connection the
owner provably did not read."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nemo_gym.routing.transport.connection import OwnerConnection, PooledTransport, request_head
from nemo_gym.routing.transport.tcp import TcpTransport
from nemo_gym.routing.transport.unix import UnixTransport


@pytest.mark.parametrize("transport", [UnixTransport, TcpTransport], ids=lambda transport: transport.__name__)
def test_every_transport_keeps_its_connections_in_the_one_shared_pool(transport):
    """Connecting, giving back, forgetting and closing are written once (``connection.PooledTransport``)."""
    assert issubclass(transport, PooledTransport)
    assert all(name not in vars(transport) for name in ("connect", "give_back", "forget", "close"))


def events_of(reply: bytes, cuts: list[int]) -> list[tuple]:
    """The events an owner connection reads from ``reply`` arriving in pieces cut at ``cuts`` (body pieces joined)."""
    connection = OwnerConnection()
    start = 0
    for cut in sorted(set(cuts)) + [len(reply)]:
        connection.data_received(reply[start:cut])
        start = cut
    events: list[tuple] = []
    while connection.has_event():
        event = connection.events.popleft()
        if event[0] == "broken":
            events.append(("broken", str(event[1])))
        elif event[0] == "body" and events and events[-1][0] == "body":
            events[-1] = ("body", events[-1][1] + event[1])
        else:
            events.append(event)
    return events


REPLIES = [
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello",
    b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\nRetry-After: 1\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
    b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n",
]


@given(reply=st.sampled_from(REPLIES), cuts=st.lists(st.integers(min_value=0, max_value=120), max_size=8))
def test_a_reply_reads_the_same_however_it_is_cut_into_pieces(reply, cuts):
    assert events_of(reply, cuts) == events_of(reply, [])


def test_a_reply_is_its_start_its_body_and_its_end_saying_whether_the_connection_may_be_reused():
    assert events_of(REPLIES[0], []) == [("start", 200, [(b"Content-Length", b"5"), (b"X-A", b"1")]), ("body", b"hello"), ("end", True)]
    assert events_of(REPLIES[1], [])[1:] == [("body", b"abcde"), ("end", True)]
    assert events_of(REPLIES[2], []) == [("start", 204, [(b"Connection", b"close")]), ("end", False)]


def test_a_reply_that_is_not_http_is_a_broken_connection():
    ((kind, message),) = events_of(b"SSH-2.0-OpenSSH\r\n\r\n", [])
    assert kind == "broken" and message.startswith("the owner's reply is not HTTP")


def test_a_request_head_is_the_callers_target_and_the_headers_given_in_order():
    scope = {"method": "POST", "path": "/a b", "raw_path": b"/a%20b", "query_string": b"x=1"}
    assert request_head(scope, [(b"host", b"h"), (b"x-b", b"2")]) == b"POST /a%20b?x=1 HTTP/1.1\r\nhost: h\r\nx-b: 2\r\n\r\n"


def test_a_connection_never_written_to_and_closed_is_provably_unread():
    connection = OwnerConnection()
    connection.connection_lost(None)
    assert connection.unread() and not connection.is_usable()
    reset = OwnerConnection()
    reset.sent = True
    reset.connection_lost(ConnectionResetError())
    assert reset.unread()
    answered = OwnerConnection()
    answered.sent = True
    answered.data_received(b"HTTP/1.1 200 OK\r\n")
    answered.connection_lost(ConnectionResetError())
    assert not answered.unread()
