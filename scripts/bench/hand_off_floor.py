"""The floor of a hand-off: what passing a client's connection to another process costs with nothing of this project
in it, for section 2 to set beside the hand-off it measures.

One TCP connection on loopback is accepted here; a duplicate of its descriptor is passed ``count`` times, one at a
time, with a request head's bytes, over a Unix socket (``socket.send_fds``) to a forked process on uvloop. That
process takes each (``socket.recv_fds``), serves it with ``loop.connect_accepted_socket`` and a protocol that is fed
the bytes and does nothing else, closes it, and answers one byte, which the sender waits for. No HTTP is parsed, no
session read, nothing relayed. The CPU of both processes over the passes, per pass, is what any hand-off on this
stack (Python, uvloop) costs at least.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import time

import uvloop

HEAD = b"POST /increment_counter HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 12\r\ncookie: " + b"s" * 300 + b"\r\n\r\n{\"count\": 1}"
CPU = struct.Struct("d")


class Fed(asyncio.Protocol):
    """A protocol that takes the bytes it is fed and does nothing with them."""

    def data_received(self, data: bytes) -> None:
        pass


def take(channel: socket.socket, count: int) -> None:
    """The receiving process: ``count`` connections taken and served, then its CPU over them sent back."""

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        taken = 0
        began = 0.0

        async def adopt(client: socket.socket, data: bytes) -> None:
            transport, protocol = await loop.connect_accepted_socket(Fed, client)
            protocol.data_received(data)
            transport.close()
            channel.send(b"k")

        def readable() -> None:
            nonlocal taken, began
            data, fds, _, _ = socket.recv_fds(channel, len(HEAD), 1)
            if not taken:
                began = time.process_time()
            loop.create_task(adopt(socket.socket(fileno=fds[0]), data))
            taken += 1
            if taken == count:
                loop.remove_reader(channel.fileno())
                loop.call_soon(done.set_result, None)

        channel.setblocking(False)
        loop.add_reader(channel.fileno(), readable)
        await done
        await asyncio.sleep(0.1)  # the last adoption's task
        channel.setblocking(True)
        channel.sendall(CPU.pack(time.process_time() - began))

    uvloop.run(serve())


def hand_off_floor(count: int) -> dict[str, float]:
    """Per pass, in microseconds of CPU: the sender's, the receiver's, and both."""
    sender, receiver = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        sender.close()
        try:
            take(receiver, count)
        finally:
            os._exit(0)
    receiver.close()
    with socket.create_server(("127.0.0.1", 0)) as listener, socket.create_connection(listener.getsockname()):
        accepted, _ = listener.accept()
        with accepted:
            began = time.thread_time()  # this thread's alone: the process calling may run others
            for _ in range(count):
                duplicate = os.dup(accepted.fileno())
                socket.send_fds(sender, [HEAD], [duplicate])
                os.close(duplicate)
                sender.recv(1)
            sent = time.thread_time() - began
    (received,) = CPU.unpack(sender.recv(CPU.size, socket.MSG_WAITALL))
    sender.close()
    os.waitpid(pid, 0)
    return {"sender_us": sent / count * 1e6, "receiver_us": received / count * 1e6, "total_us": (sent + received) / count * 1e6}
