"""The checkpoint's gate (two ``Gate`` objects on one directory stand for two workers of one host)."""

from __future__ import annotations

import asyncio

import httpx
from starlette.responses import JSONResponse

from nemo_gym.durable.checkpoint import CheckpointGate, Gate


async def served(scope, receive, send) -> None:
    await JSONResponse({"served": True})(scope, receive, send)


def test_a_pause_refuses_new_requests_on_every_worker_of_the_host_until_it_is_resumed(tmp_path):
    pauser, other = Gate(str(tmp_path)), Gate(str(tmp_path))
    assert asyncio.run(pauser.pause(60, 1))
    assert (other.enter(), pauser.enter()) == (None, None)
    pauser.resume()
    assert other.enter() is not None


def test_a_pause_waits_for_the_requests_in_flight_on_another_worker_and_admits_none_meanwhile(tmp_path):
    pauser, busy = Gate(str(tmp_path)), Gate(str(tmp_path))

    async def scenario() -> tuple[bool, bool, bool]:
        generation = busy.enter()
        pausing = asyncio.create_task(pauser.pause(60, 10))
        await asyncio.sleep(0.2)
        waited, admitted = not pausing.done(), (busy.enter(), pauser.enter()) != (None, None)
        busy.leave(generation)
        return waited, admitted, await asyncio.wait_for(pausing, 5)

    assert asyncio.run(scenario()) == (True, False, True)


def test_a_pause_whose_requests_in_flight_do_not_finish_within_its_hold_is_lifted_at_once(tmp_path):
    pauser, busy = Gate(str(tmp_path)), Gate(str(tmp_path))
    assert busy.enter() is not None
    assert not asyncio.run(pauser.pause(60, 0.1))
    assert pauser.enter() is not None


def test_a_pause_waits_for_the_requests_of_both_generations(tmp_path):
    """A drain that gave up leaves requests in flight in the old generation, beside new ones in the new."""
    pauser, old, new = Gate(str(tmp_path)), Gate(str(tmp_path)), Gate(str(tmp_path))
    before = old.enter()
    assert not asyncio.run(pauser.drain(0.05))
    since = new.enter()
    assert before != since
    assert not asyncio.run(pauser.pause(60, 0.1))
    new.leave(since)
    assert not asyncio.run(pauser.pause(60, 0.1))
    old.leave(before)
    assert asyncio.run(pauser.pause(60, 0.1))


def test_a_pause_ends_by_itself_after_its_seconds(tmp_path):
    gate = Gate(str(tmp_path))
    assert asyncio.run(gate.pause(0.2, 1))
    assert gate.enter() is None
    asyncio.run(asyncio.sleep(0.3))
    assert gate.enter() is not None


def test_a_drain_waits_for_the_requests_in_flight_on_another_worker_while_admitting_new_ones(tmp_path):
    drainer, busy = Gate(str(tmp_path)), Gate(str(tmp_path))

    async def scenario() -> tuple[bool, bool, bool]:
        old = busy.enter()
        draining = asyncio.create_task(drainer.drain(10))
        await asyncio.sleep(0.2)
        new = busy.enter(), drainer.enter()
        waited, admitted = not draining.done(), None not in new
        busy.leave(old)
        drained = await asyncio.wait_for(draining, 5)  # the new ones are still in flight
        busy.leave(new[0])
        drainer.leave(new[1])
        return waited, admitted, drained

    assert asyncio.run(scenario()) == (True, True, True)


def test_a_drain_whose_requests_in_flight_do_not_finish_in_time_fails_having_refused_none(tmp_path):
    drainer, busy = Gate(str(tmp_path)), Gate(str(tmp_path))
    busy.enter()
    assert not asyncio.run(drainer.drain(0.1))
    assert (drainer.enter() is not None, drainer.paused_until()) == (True, 0.0)


def body_request(chunks: asyncio.Queue, sent: list) -> tuple:
    """A request to ``CheckpointGate`` whose body arrives as the test puts its messages in ``chunks``."""
    scope = {"type": "http", "method": "POST", "path": "/increment_counter", "headers": [(b"content-length", b"2")]}

    async def send(message) -> None:
        sent.append(message)

    return scope, chunks.get, send


def chunk(body: bytes, more: bool) -> dict:
    return {"type": "http.request", "body": body, "more_body": more}


def test_a_request_whose_body_is_still_arriving_is_not_in_flight_and_a_pause_does_not_wait_for_it(tmp_path):
    pauser, receiving = Gate(str(tmp_path)), Gate(str(tmp_path))
    bodies, sent, chunks = [], [], asyncio.Queue()

    async def reading(scope, receive, send) -> None:
        body = b""
        while (message := await receive()).get("more_body"):
            body += message["body"]
        bodies.append(body + message["body"])
        await served(scope, receive, send)

    async def scenario() -> bool:
        request = asyncio.create_task(CheckpointGate(reading, receiving)(*body_request(chunks, sent)))
        await chunks.put(chunk(b"a", True))
        await asyncio.sleep(0.05)
        paused = await asyncio.wait_for(pauser.pause(60, 1), 5)
        pauser.resume()
        await chunks.put(chunk(b"b", False))
        await asyncio.wait_for(request, 5)
        return paused

    assert asyncio.run(scenario())
    assert (bodies, sent[0]["status"]) == ([b"ab"], 200)


def test_a_request_whose_body_ends_during_a_pause_gets_503_and_is_never_served(tmp_path):
    pauser, receiving = Gate(str(tmp_path)), Gate(str(tmp_path))
    sent, chunks = [], asyncio.Queue()

    async def scenario() -> None:
        request = asyncio.create_task(CheckpointGate(reached, receiving)(*body_request(chunks, sent)))
        await chunks.put(chunk(b"a", True))
        await asyncio.sleep(0.05)
        assert await asyncio.wait_for(pauser.pause(60, 1), 5)
        await chunks.put(chunk(b"b", False))
        await asyncio.wait_for(request, 5)

    async def reached(scope, receive, send) -> None:
        raise AssertionError("served during the pause")

    asyncio.run(scenario())
    assert sent[0]["status"] == 503


def test_a_request_whose_caller_leaves_before_its_body_is_whole_is_never_served_nor_held_in_flight(tmp_path):
    pauser, receiving = Gate(str(tmp_path)), Gate(str(tmp_path))
    sent, chunks = [], asyncio.Queue()

    async def reached(scope, receive, send) -> None:
        raise AssertionError("served without its body")

    async def scenario() -> bool:
        await chunks.put(chunk(b"a", True))
        await chunks.put({"type": "http.disconnect"})
        await asyncio.wait_for(CheckpointGate(reached, receiving)(*body_request(chunks, sent)), 5)
        return await asyncio.wait_for(pauser.pause(60, 0.1), 5)

    assert (asyncio.run(scenario()), sent, receiving.in_flight) == (True, [], [0, 0])


def test_a_request_the_pause_meets_gets_503_with_retry_after_and_is_never_served(tmp_path):
    gate = Gate(str(tmp_path))
    asyncio.run(gate.pause(60, 1))
    reply = asyncio.run(call(CheckpointGate(served, gate), "POST", "/increment_counter"))
    assert (reply.status_code, reply.headers["retry-after"], "checkpoint" in reply.json()["detail"]) == (503, "1", True)


async def call(app, method: str, target: str, headers: dict | None = None) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://server") as client:
        return await client.request(method, target, headers=headers)
