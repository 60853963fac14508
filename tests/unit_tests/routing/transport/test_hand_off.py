"""The sender's side of a hand-off: passed at once or refused at once, never waited on past its answer's time.

Real sockets: a client's TCP connection on loopback that the test accepts, a worker's hand-off socket in the
abstract namespace (a real receiver's, or a listener the test holds to play a frozen or late one).
"""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

from nemo_gym.routing.transport import hand_off
from nemo_gym.routing.transport.hand_off import HandOffs, hand_off_address
from tests.unit_tests.routing.transport.hand_off_ends import TIMEOUT_SECONDS, accepted_pair, open_fds, receiving

pytestmark = pytest.mark.anyio
# More hand-offs than any hand-off socket's queue holds.
FLOOD = 100_000


async def test_a_sibling_with_no_hand_off_socket_refuses_at_once(socket_dir):
    client, accepted = accepted_pair()
    with client, accepted:
        senders = HandOffs(socket_dir)
        assert await senders.send("nobody", accepted.fileno(), b"GET / HTTP/1.1\r\n\r\n") == "refused"
        assert senders.sockets == {}


async def test_a_full_hand_off_socket_is_told_at_once_and_nothing_waits_on_it(socket_dir):
    """A receiver that reads nothing (frozen, or flooded): the sender learns it is full at the first send that does not fit."""
    before = open_fds()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(hand_off_address(socket_dir, "frozen"))
    listener.listen(1)
    client, accepted = accepted_pair()
    senders = HandOffs(socket_dir)
    with client, accepted:
        posted = [senders.post("frozen", accepted.fileno(), b"x" * 1000) for _ in range(FLOOD)]
        answers = [reason for reason, _ in posted]
        assert "full" in answers and set(answers) <= {None, "full"}
        assert answers[answers.index("full") :] == ["full"] * (FLOOD - answers.index("full"))
        # Those queued wait for the receiver to take them; with the sender's connection closed, none was taken.
        waiting = [taken for _, taken in posted if taken is not None]
        assert not any(taken.done() for taken in waiting)
    senders.close()
    assert {taken.result() for taken in waiting} == {"refused"}
    listener.close()  # the descriptors in flight go with it: none is left open in this process
    assert open_fds() == before


async def test_a_receiver_gone_is_refused_and_its_connection_forgotten(socket_dir):
    async with receiving(socket_dir, "going"):
        senders = HandOffs(socket_dir)
        client, accepted = accepted_pair()
        with client, accepted:
            client.sendall(b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n")
            assert await senders.send("going", accepted.fileno(), await asyncio.to_thread(accepted.recv, 65536)) is None
            await asyncio.to_thread(client.recv, 65536)
    client, accepted = accepted_pair()
    with client, accepted:
        assert await senders.send("going", accepted.fileno(), b"GET /y HTTP/1.1\r\n\r\n") == "refused"
        assert "going" not in senders.sockets
        assert await senders.send("going", accepted.fileno(), b"GET /y HTTP/1.1\r\n\r\n") == "refused"


async def test_a_hand_off_not_answered_in_time_is_taken_back_and_the_late_answer_told_so(socket_dir, monkeypatch):
    monkeypatch.setattr(hand_off, "ANSWER_SECONDS", 0.1)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(hand_off_address(socket_dir, "late"))
    listener.listen(1)
    client, accepted = accepted_pair()
    senders = HandOffs(socket_dir)
    with listener, client, accepted:
        async with asyncio.timeout(TIMEOUT_SECONDS):
            assert await senders.send("late", accepted.fileno(), b"GET / HTTP/1.1\r\n\r\n") == "unanswered"
        peer, _ = listener.accept()
        with peer:
            peer.settimeout(TIMEOUT_SECONDS)
            _, fds, _, _ = socket.recv_fds(peer, 65536, 1)
            os.close(fds[0])
            peer.send(hand_off.RECEIVED)
            assert await asyncio.to_thread(peer.recv, 1) == hand_off.TAKEN_BACK
            # An answer in time is the receiver's.
            sent = asyncio.ensure_future(senders.send("late", accepted.fileno(), b"GET / HTTP/1.1\r\n\r\n"))
            _, fds, _, _ = await asyncio.to_thread(socket.recv_fds, peer, 65536, 1)
            os.close(fds[0])
            peer.send(hand_off.RECEIVED)
            assert await sent is None
            assert await asyncio.to_thread(peer.recv, 1) == hand_off.YOURS
    senders.close()


