"""Serve an ASGI app with a real uvicorn on a free loopback port, inside the test's own event loop."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import uvicorn

from nemo_gym.config import free_port

START_TIMEOUT_SECONDS = 10


@contextlib.asynccontextmanager
async def serving(app: Any, port: int | None = None) -> AsyncIterator[str]:
    """Run ``app`` until the block ends; yields its base URL."""
    port = port or free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="on", log_level="warning", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(START_TIMEOUT_SECONDS):
            while not server.started:
                if task.done():
                    task.result()
                    raise RuntimeError("uvicorn stopped before it started")
                await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, START_TIMEOUT_SECONDS)



@contextlib.contextmanager
def serving_in_a_thread(app: Any, port: int, **options: Any) -> Iterator[int]:
    """Run ``app`` in a thread of its own (for tests whose clients block) until the block ends; yields its port.
    ``options``: uvicorn's (``http=`` a protocol under test, say)."""
    config = uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_level="warning", **options)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        assert server.started
        yield port
    finally:
        server.should_exit = True
        thread.join(START_TIMEOUT_SECONDS)
