"""Sessions of the upstream-style Ray server (tests/upstream_style/resources_servers/upstream_ray_verify):
``python -m tests.e2e.ray.products URL SESSIONS`` prints one JSON line, a record per session.

Each session, all at once, with aiohttp's cookie jar of its own: ``/seed_session`` with a product to
compute, then ``/verify`` of a response whose text is the right product (even sessions) or one off
(odd ones). Per session: the expected reward, the status and body of /verify.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import aiohttp

from nemo_gym.openai_utils import NeMoGymResponseCreateParamsNonStreaming, new_response

REQUEST_TIMEOUT_SECONDS = 120


def verify_body(text: str) -> dict[str, Any]:
    params = NeMoGymResponseCreateParamsNonStreaming(input="What is the product?")
    message = {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": text, "annotations": []}]}
    response = new_response(params, output=[message])
    return {"responses_create_params": params.model_dump(mode="json", exclude_unset=True), "response": response.model_dump(mode="json")}


async def session(url: str, number: int) -> dict[str, Any]:
    a, b = 3 + number, 7 + 2 * number
    right = number % 2 == 0
    answer = a * b if right else a * b + 1
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS)
    async with aiohttp.ClientSession(timeout=timeout, cookie_jar=aiohttp.CookieJar(unsafe=True)) as client:
        async with client.post(f"{url}/seed_session", json={"a": a, "b": b}) as reply:
            if reply.status != 200:
                return {"expected_reward": float(right), "status": reply.status, "body": await reply.text()}
        async with client.post(f"{url}/verify", json=verify_body(f"The product is {answer}")) as reply:
            body = await reply.json(content_type=None)
            return {"expected_reward": float(right), "status": reply.status, "body": body}


async def main(url: str, sessions: int) -> list[dict[str, Any]]:
    return await asyncio.gather(*(session(url, number) for number in range(sessions)))


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], int(sys.argv[2])))))
