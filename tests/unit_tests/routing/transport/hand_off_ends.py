"""Both ends of a hand-off in the test's own loop, for the tests of the sender and the receiver: a worker's public
server (uvicorn) with its hand-off socket, and clients' TCP connections on loopback that the test accepts."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import socket
from collections.abc import AsyncIterator

import uvicorn

from nemo_gym.config import free_port
from nemo_gym.process.public_server import PublicServer
from nemo_gym.protocols.handing_off import HANDED_EXTENSION, HandingOffProtocol
from nemo_gym.protocols.input_limits import InputLimits
from nemo_gym.routing.transport.hand_off import READING_LENGTH, HandOffs, connected, hand_off_address
from nemo_gym.routing.transport.hand_off_receiver import HandOffReceiver

TIMEOUT_SECONDS = 10
# More answers than fit in a socket whose send buffer is the kernel's least.
FLOODED = 30


async def hello(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    handed = " (handed)" if scope["extensions"].get(HANDED_EXTENSION) else ""
    body = f"{scope['path']} from {scope['client'][0]}{handed}".encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


@contextlib.asynccontextmanager
async def receiving(socket_dir: str, worker_id: str, app=hello) -> AsyncIterator[tuple[PublicServer, HandOffReceiver]]:
    """A worker's public server, serving ``app`` in this loop, and its hand-off socket."""
    config = uvicorn.Config(app, host="127.0.0.1", port=free_port(), lifespan="off", log_level="warning", http=InputLimits().protocol(HandingOffProtocol))
    server = PublicServer(config)
    task = asyncio.create_task(server.serve())
    receiver = HandOffReceiver(socket_dir, worker_id, server)
    try:
        async with asyncio.timeout(TIMEOUT_SECONDS):
            while not server.started:
                await asyncio.sleep(0.01)
        receiver.start()
        yield server, receiver
    finally:
        await receiver.stop()
        server.should_exit = True
        await asyncio.wait_for(task, TIMEOUT_SECONDS)


async def hand_over(senders: HandOffs, worker_id: str, request: bytes) -> tuple[socket.socket, str | None]:
    """A client's connection that sent ``request``, its accepted end handed to ``worker_id`` and closed here: the
    client, and why the hand-off was refused (None: taken)."""
    client, accepted = accepted_pair()
    with accepted:
        client.sendall(request)
        return client, await senders.send(worker_id, accepted.fileno(), await asyncio.to_thread(accepted.recv, 65536))


def unread(data: bytes) -> bytes:
    """A hand-off's message of ``data`` with no reading of its session (``hand_off``), as a raw sender writes it."""
    return READING_LENGTH.pack(0) + data


def accepted_pair() -> tuple[socket.socket, socket.socket]:
    """A client's connection on loopback, and the end of it that a worker accepted."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname(), timeout=TIMEOUT_SECONDS)
        accepted, _ = listener.accept()
    return client, accepted


async def replied(client: socket.socket, text: bytes) -> bytes:
    """What ``client`` reads until ``text`` came (or the connection ended)."""
    data = b""
    while text not in data:
        chunk = await asyncio.to_thread(client.recv, 65536)
        if not chunk:
            break
        data += chunk
    return data


def open_fds() -> int:
    """This process's open descriptors, once garbage is collected: a socket an earlier test of this process left
    unreferenced (U6: one) would otherwise close mid-count."""
    gc.collect()
    return len(os.listdir("/proc/self/fd"))


async def flooded(socket_dir: str, receiver: HandOffReceiver) -> tuple[socket.socket, list[socket.socket]]:
    """A raw sender's connection to ``receiver``, whose room for answers is made as small as the kernel allows, and
    the clients of ``FLOODED`` hand-offs sent on it at once, once the receiver had time to read them and answer what fits."""
    raw = connected(hand_off_address(socket_dir, "receiver"))
    async with asyncio.timeout(TIMEOUT_SECONDS):
        while not receiver.peers:
            await asyncio.sleep(0.01)
    next(iter(receiver.peers)).setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1)
    clients = []
    for number in range(FLOODED):
        client, accepted = accepted_pair()
        clients.append(client)
        client.sendall(b"GET /%d HTTP/1.1\r\nHost: t\r\n\r\n" % number)
        socket.send_fds(raw, [unread(await asyncio.to_thread(accepted.recv, 65536))], [accepted.fileno()])
        accepted.close()
    await asyncio.sleep(0.2)
    return raw, clients


