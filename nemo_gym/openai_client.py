"""``NeMoGymAsyncOpenAI``: upstream's small client of an OpenAI-compatible endpoint, over the process's shared aiohttp session.

Each ``create_*`` call returns the reply's JSON as a dict. A reply whose status is a rate limit or a
passing server error is tried again after a pause; a rate limit does not use up a try. The last error
reply raises (``server_utils.raise_for_status``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from pydantic import BaseModel, Field

from nemo_gym.server_utils import MAX_NUM_TRIES, get_response_json, raise_for_status, request

# 429 rate limit; 502, 503, 504 and 520: an overloaded or timed-out gateway in front of the model.
RATE_LIMIT_ERROR_CODES = [429, 502, 503, 504, 520]
# A 500 now and then is worth another try too, but it counts against the tries.
RETRY_ERROR_CODES = RATE_LIMIT_ERROR_CODES + [500]
RETRY_PAUSE_SECONDS = 0.5


class NeMoGymAsyncOpenAI(BaseModel):
    """The endpoint at ``base_url`` (ending in ``/v1``), called with ``Authorization: Bearer <api_key>``."""

    base_url: str
    api_key: str
    # Whether this client only calls the Gym's own servers.
    internal: bool = False
    # Sent with every request (the bearer token is added to them).
    default_headers: dict[str, str] = Field(default_factory=dict)

    async def _request(self, method: str, url: str, **kwargs: Any) -> aiohttp.ClientResponse:
        headers = {**self.default_headers, "Authorization": f"Bearer {self.api_key}"}
        tries_left = MAX_NUM_TRIES
        while True:
            response = await request(method, url, _internal=self.internal, headers=headers, **kwargs)
            tries_left -= response.status not in RATE_LIMIT_ERROR_CODES
            if response.status not in RETRY_ERROR_CODES or tries_left == 0:
                await raise_for_status(response)
                return response
            await asyncio.sleep(RETRY_PAUSE_SECONDS)

    async def _json(self, method: str, url: str, **kwargs: Any) -> Any:
        return await get_response_json(await self._request(method, url, **kwargs))

    async def create_models(self) -> Any:
        return await self._json("GET", f"{self.base_url}/models")

    async def create_chat_completion(self, **kwargs: Any) -> Any:
        return await self._json("POST", f"{self.base_url}/chat/completions", json=kwargs)

    async def create_completion(self, **kwargs: Any) -> Any:
        return await self._json("POST", f"{self.base_url}/completions", json=kwargs)

    async def create_response(self, **kwargs: Any) -> Any:
        return await self._json("POST", f"{self.base_url}/responses", json=kwargs)

    async def create_tokenize(self, **kwargs: Any) -> Any:
        """vLLM's ``/tokenize``, which lives beside ``/v1``, not under it."""
        return await self._json("POST", f"{self.base_url.removesuffix('/v1')}/tokenize", json=kwargs)
