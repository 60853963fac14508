"""Cancel on disconnect: a local handler, on a single-worker or routed server, stops when its caller leaves."""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid

import pytest
from fastapi import FastAPI, Request

from tests.unit_tests.routing_workers import EchoServer, Worker

pytestmark = pytest.mark.anyio


class SleepServer(EchoServer):
    """``/sleep`` notes that it started, reads its body, sleeps, and notes how it ended."""

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/sleep")(self.sleep)
        self.started = asyncio.Event()
        self.outcome: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        return app

    async def sleep(self, request: Request) -> dict[str, str]:
        self.started.set()
        try:
            await request.body()
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.outcome.set_result("cancelled")
            raise
        except Exception as error:
            self.outcome.set_result(repr(error))
            raise
        self.outcome.set_result("finished")
        return {"status": "finished"}


@pytest.mark.parametrize("num_workers", [1, 2])
@pytest.mark.parametrize(("length", "sent"), [(0, b""), (16, b'{"some": "body"}'), (1000, b'{"half a')], ids=["no body", "body", "caller leaves mid-body"])
async def test_a_local_handler_is_cancelled_within_a_second_of_its_caller_leaving(num_workers, length, sent):
    socket_dir = tempfile.mkdtemp(prefix="ngw-test-", dir="/tmp") if num_workers > 1 else None
    worker = await Worker(f"sleep_{uuid.uuid4().hex[:8]}", num_workers, socket_dir, SleepServer).start()
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", worker.port)
        writer.write(b"POST /sleep HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (length, sent))
        await writer.drain()
        async with asyncio.timeout(10):
            await worker.server.started.wait()
        writer.close()
        async with asyncio.timeout(1):
            assert await worker.server.outcome == "cancelled"
    finally:
        await worker.stop()
        if socket_dir:
            os.rmdir(socket_dir)
