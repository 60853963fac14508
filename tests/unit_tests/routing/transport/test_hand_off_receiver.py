"""The receiver's side of a hand-off: it serves what its sender says is its own with its public server's protocol,
closes the rest unserved, and leaks no descriptor.

Real sockets: a client's TCP connection on loopback that the test accepts, a worker's hand-off socket in the
abstract namespace, and a ``PublicServer`` (uvicorn) in the test's own loop.
"""

from __future__ import annotations

import asyncio
import os
import resource
import socket

import pytest

from nemo_gym.routing.transport import hand_off
from nemo_gym.routing.transport.hand_off import HandOffs, connected, hand_off_address
from tests.unit_tests.routing.transport.hand_off_ends import FLOODED, TIMEOUT_SECONDS, accepted_pair, flooded, hand_over, open_fds, receiving, replied, unread

pytestmark = pytest.mark.anyio


async def test_a_handed_off_connection_is_served_by_the_receivers_public_server_bytes_read_first(socket_dir):
    async with receiving(socket_dir, "receiver") as (server, _):
        client, accepted = accepted_pair()
        with client:
            client.sendall(b"GET /first HTTP/1.1\r\nHost: t\r\n\r\nGET /second HTTP/1.1\r\nHost: t\r\n\r\n")
            read = await asyncio.to_thread(accepted.recv, 65536)
            senders = HandOffs(socket_dir)
            assert await senders.send("receiver", accepted.fileno(), read) is None
            accepted.close()
            replies = await replied(client, b"/second from")
            assert b"/first from 127.0.0.1" in replies and replies.index(b"/first") < replies.index(b"/second")
            # The same connection's next request reaches the receiver too, and it is one of its server's connections.
            client.sendall(b"GET /third HTTP/1.1\r\nHost: t\r\n\r\n")
            assert b"/third from" in await replied(client, b"/third from")
            assert len(server.server_state.connections) == 1
            senders.close()


@pytest.mark.parametrize(
    "message",
    [
        b"\x00\x00",
        hand_off.READING_LENGTH.pack(100) + b"{}",
        hand_off.READING_LENGTH.pack(3) + b"{{{GET / HTTP/1.1\r\n\r\n",
        hand_off.READING_LENGTH.pack(5_000) + b"[" * 5_000,
        hand_off.READING_LENGTH.pack(6) + b"[1, 2]GET / HTTP/1.1\r\n\r\n",
    ],
    ids=["shorter-than-its-length", "reading-past-its-end", "reading-not-json", "reading-nested-too-deep", "reading-not-an-object"],
)
async def test_a_message_whose_reading_of_the_session_is_not_a_whole_json_object_ends_its_senders_connection_unacknowledged(socket_dir, message):
    async with receiving(socket_dir, "receiver"):
        raw = connected(hand_off_address(socket_dir, "receiver"))
        one, two = socket.socketpair()
        socket.send_fds(raw, [message], [one.fileno()])
        raw.settimeout(TIMEOUT_SECONDS)
        assert await asyncio.to_thread(raw.recv, 1) == b""  # no acknowledgement: ended
        raw.close()
        one.close()
        two.settimeout(TIMEOUT_SECONDS)
        assert await asyncio.to_thread(two.recv, 1) == b""  # the receiver kept no copy
        two.close()


@pytest.mark.parametrize("descriptors", [0, 2])
async def test_a_message_without_exactly_one_descriptor_ends_its_senders_connection_unacknowledged(socket_dir, descriptors):
    async with receiving(socket_dir, "receiver"):
        before = open_fds()
        raw = connected(hand_off_address(socket_dir, "receiver"))
        pairs = [socket.socketpair() for _ in range(descriptors)]
        socket.send_fds(raw, [unread(b"GET / HTTP/1.1\r\n\r\n")], [one.fileno() for one, _ in pairs])
        raw.settimeout(TIMEOUT_SECONDS)
        assert await asyncio.to_thread(raw.recv, 1) == b""  # no acknowledgement: ended
        raw.close()
        for one, two in pairs:
            one.close()
            assert await asyncio.to_thread(two.recv, 1) == b""  # the receiver kept no copy
            two.close()
        senders = HandOffs(socket_dir)
        client, refused = await hand_over(senders, "receiver", b"GET /served HTTP/1.1\r\nHost: t\r\n\r\n")
        with client:
            assert refused is None
            assert b"/served from" in await replied(client, b"/served from")
            senders.close()
        # Every descriptor let go: the client's connection ended by it, the senders' connection by the sender.
        for _ in range(TIMEOUT_SECONDS * 100):
            if open_fds() == before:
                break
            await asyncio.sleep(0.01)
        assert open_fds() == before


async def test_a_receiver_serves_what_its_sender_says_is_its_own_and_closes_what_was_taken_back(socket_dir):
    async with receiving(socket_dir, "receiver"):
        raw = connected(hand_off_address(socket_dir, "receiver"))
        raw.setblocking(True)
        raw.settimeout(TIMEOUT_SECONDS)
        with raw:
            async def handed(path: bytes, reply: bytes) -> bytes:
                """What the client reads once its connection was handed with ``reply`` as the sender's say."""
                client, accepted = accepted_pair()
                with client:
                    client.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: t\r\n\r\n")
                    socket.send_fds(raw, [unread(await asyncio.to_thread(accepted.recv, 65536))], [accepted.fileno()])
                    accepted.close()
                    assert await asyncio.to_thread(raw.recv, 1) == hand_off.RECEIVED
                    raw.send(reply)
                    return await replied(client, path + b" from")

            # Taken back: the receiver closed its copy (the last one) unserved, so the client reads its end.
            assert await handed(b"/back", hand_off.TAKEN_BACK) == b""
            assert b"/yours from" in await handed(b"/yours", hand_off.YOURS)


async def test_a_sender_gone_before_its_reply_leaves_the_receivers_copy_closed_unserved(socket_dir):
    async with receiving(socket_dir, "receiver"):
        raw = connected(hand_off_address(socket_dir, "receiver"))
        raw.setblocking(True)
        raw.settimeout(TIMEOUT_SECONDS)
        client, accepted = accepted_pair()
        with client:
            client.sendall(b"GET /orphan HTTP/1.1\r\nHost: t\r\n\r\n")
            socket.send_fds(raw, [unread(await asyncio.to_thread(accepted.recv, 65536))], [accepted.fileno()])
            accepted.close()
            assert await asyncio.to_thread(raw.recv, 1) == hand_off.RECEIVED
            raw.close()
            assert await replied(client, b"/orphan from") == b""


async def test_a_graceful_stop_lets_a_handed_off_connections_request_finish_then_closes_it(socket_dir):
    release, entered = asyncio.Event(), asyncio.Event()

    async def slow(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        entered.set()
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"8")]})
        await send({"type": "http.response.body", "body": b"finished"})

    async with receiving(socket_dir, "stopping", slow) as (server, _):
        senders = HandOffs(socket_dir)
        client, refused = await hand_over(senders, "stopping", b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\n")
        with client:
            assert refused is None
            await entered.wait()
            server.should_exit = True
            await asyncio.sleep(0.2)  # the stop under way, the request still in its handler
            release.set()
            # The whole reply, then the end of the connection (read to its end: the server closed it).
            assert (await replied(client, b"never sent")).endswith(b"\r\n\r\nfinished")
        senders.close()


async def test_a_descriptor_limit_reached_mid_hand_off_refuses_it_and_leaks_no_descriptor(socket_dir):
    """The receiver cannot take the descriptor (no free slot under its limit): the kernel drops it, the receiver
    ends its sender's connection unanswered, and the sender forwards. Nothing is left open either side."""
    async with receiving(socket_dir, "crowded"):
        senders = HandOffs(socket_dir)
        client, accepted = accepted_pair()
        with client, accepted:
            # The connection to the receiver made, and taken by it, while descriptors are free.
            assert await senders.send("crowded", os.dup(accepted.fileno()), b"GET / HTTP/1.1\r\nHost: t\r\n\r\n") is None
            await asyncio.to_thread(client.recv, 65536)
            before = open_fds()
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            lowest_free = os.dup(0)
            os.close(lowest_free)
            resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
            try:
                async with asyncio.timeout(TIMEOUT_SECONDS):
                    assert await senders.send("crowded", accepted.fileno(), b"GET / HTTP/1.1\r\nHost: t\r\n\r\n") == "refused"
            finally:
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            senders.close()
            # Both ends of the sender's connection to the receiver closed (it refused); the handed descriptor gone with it.
            for _ in range(TIMEOUT_SECONDS * 100):
                if open_fds() == before - 2:
                    break
                await asyncio.sleep(0.01)
            assert open_fds() == before - 2


async def test_only_the_request_a_connection_was_handed_with_is_marked_handed_so_the_receiver_places_it_nowhere_else(socket_dir):
    async with receiving(socket_dir, "receiver"):
        senders = HandOffs(socket_dir)
        client, refused = await hand_over(senders, "receiver", b"GET /first HTTP/1.1\r\nHost: t\r\n\r\nGET /second HTTP/1.1\r\nHost: t\r\n\r\n")
        with client:
            assert refused is None
            replies = await replied(client, b"/second from")
            client.sendall(b"GET /third HTTP/1.1\r\nHost: t\r\n\r\n")
            replies += await replied(client, b"/third from")
            assert b"/first from 127.0.0.1 (handed)" in replies and replies.count(b"(handed)") == 1
            senders.close()


async def test_hand_offs_answered_faster_than_their_sender_reads_are_all_served_once_it_says_they_are_the_receivers(socket_dir):
    """A flood read at once (the receiver woke to a full queue): its answers do not all fit in the socket, so the
    receiver pauses reading until they went, and drops nothing: each hand-off its sender then calls the receiver's
    own is served."""
    async with receiving(socket_dir, "receiver") as (_, receiver):
        raw, clients = await flooded(socket_dir, receiver)
        raw.setblocking(True)
        raw.settimeout(TIMEOUT_SECONDS)
        with raw:
            for _ in range(FLOODED):
                assert await asyncio.to_thread(raw.recv, 1) == hand_off.RECEIVED
                raw.send(hand_off.YOURS)
            for number, client in enumerate(clients):
                with client:
                    assert b"/%d from" % number in await replied(client, b"/%d from" % number)


async def test_a_sender_gone_while_owed_answers_leaves_served_every_hand_off_it_called_the_receivers(socket_dir):
    """The receiver paused (its answers did not fit); its sender replies "yours" to the answers it read, then goes.
    The receiver reads those replies before it lets the sender's connections go: they are served, the rest closed."""
    async with receiving(socket_dir, "receiver") as (_, receiver):
        raw, clients = await flooded(socket_dir, receiver)
        yours = 0
        with raw:  # the answers there are, each called the receiver's, then gone before the receiver runs again
            while True:
                try:
                    assert raw.recv(1) == hand_off.RECEIVED
                except BlockingIOError:
                    break
                raw.send(hand_off.YOURS)
                yours += 1
        assert 0 < yours < FLOODED
        for number, client in enumerate(clients):
            with client:
                served = await replied(client, b"/%d from" % number)
                assert (b"/%d from" % number in served) == (number < yours), (number, yours, served)
