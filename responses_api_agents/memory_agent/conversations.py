"""Drive two-turn conversations through a memory agent and check that each second turn continues its first.

Each conversation asks for "Add A, then add B" with its own A and B. The model answers turn 1 with a
call to increment_counter(A). In turn 2 the caller sends only that call's output, so the model can ask
for increment_counter(B) next only if the agent put turn 1 back in front of it. (With the scripted
backend, a conversation without that memory has no task at all, and the backend says it has no script.)
"""

from __future__ import annotations

import asyncio
import json

from nemo_gym.client.reading import ReadingClient, ServerReply

THINK_SECONDS = 0.05


def function_calls(reply: ServerReply) -> list[tuple[str, dict]]:
    return [(item["name"], json.loads(item["arguments"])) for item in reply.body["output"] if item["type"] == "function_call"]


async def two_turn_conversation(client: ReadingClient, agent: str, number: int) -> dict:
    """One conversation: ``{"continued": bool}``, plus ``"error"`` when a turn failed or turn 1 went astray."""
    turn_one = await first_turn(client, agent, number)
    if not isinstance(turn_one, ServerReply):
        return turn_one
    await asyncio.sleep(THINK_SECONDS)  # the caller runs the tool between the turns
    return await second_turn(client, agent, number, turn_one)


async def first_turn(client: ReadingClient, agent: str, number: int) -> ServerReply | dict:
    """Turn 1's reply, which asks for increment_counter(1000 + number); or the failed conversation's result."""
    task = f"The counter starts at 0. Add {1000 + number}, then add {5000 + number}, then get the count and tell me."
    turn_one = await client.post(agent, "/v1/responses", json={"input": task})
    if not turn_one.ok or function_calls(turn_one) != [("increment_counter", {"count": 1000 + number})]:
        return {"continued": False, "error": f"turn 1 answered {turn_one.status}: {turn_one.text[:300]}"}
    return turn_one


async def second_turn(client: ReadingClient, agent: str, number: int, turn_one: ServerReply) -> dict:
    """Turn 2 sends only the call's output: ``continued`` when the model asks for the next addition."""
    output = {"type": "function_call_output", "call_id": turn_one.body["output"][0]["call_id"], "output": '{"success": true}'}
    turn_two = await client.post(agent, "/v1/responses", json={"input": [output]}, cookies=turn_one.cookies)
    if not turn_two.ok:
        return {"continued": False, "error": f"turn 2 answered {turn_two.status}: {turn_two.text[:300]}"}
    return {"continued": function_calls(turn_two) == [("increment_counter", {"count": 5000 + number})]}


async def run_conversations(client: ReadingClient, agent: str, count: int, concurrency: int) -> list[dict]:
    gate = asyncio.Semaphore(concurrency)

    async def one(number: int) -> dict:
        async with gate:
            return await two_turn_conversation(client, agent, number)

    return await asyncio.gather(*(one(number) for number in range(count)))
