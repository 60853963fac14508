"""The reading client: calls an instance by name and returns the finished reply (``ServerReply``).

``ReadingClient`` is upstream's ``ServerClient`` (``nemo_gym.server_utils``: same pool, same name
lookup) with calls that read the reply before returning, for callers that want status, JSON body and
cookies in one value: rollout drivers, tests, scripts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp
from omegaconf import OmegaConf

from nemo_gym.config import Instance, config_of
from nemo_gym.server_utils import DEFAULT_TIMEOUT, ServerClient
from nemo_gym.sessions.cookie import session_cookie_name


@dataclass
class ServerReply:
    """A finished reply: status, decoded JSON body (or None) and the cookies it set."""

    status: int
    body: Any
    cookies: dict[str, str]
    text: str

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @classmethod
    async def read(cls, response: aiohttp.ClientResponse) -> "ServerReply":
        async with response:
            text = (await response.read()).decode("utf-8", errors="replace")
            try:
                body = await response.json(content_type=None)
            except ValueError:
                body = None
            return cls(response.status, body, {key: morsel.value for key, morsel in response.cookies.items()}, text)


class ReadingClient(ServerClient):
    """Every call names the target instance and passes the session's cookies explicitly."""

    def __init__(self, instances: dict[str, Instance], limit: int = 0) -> None:
        super().__init__(global_config_dict=OmegaConf.create(config_of(instances)), limit=limit)

    async def post(  # type: ignore[override]
        self,
        server_name: str,
        path: str,
        json: Any = None,
        cookies: dict[str, str] | None = None,
        timeout: aiohttp.ClientTimeout | None = None,
    ) -> ServerReply:
        return await self.call("POST", server_name, path, json, cookies, timeout)

    async def get(self, server_name: str, path: str, cookies: dict[str, str] | None = None) -> ServerReply:  # type: ignore[override]
        return await self.call("GET", server_name, path, None, cookies, None)

    async def call(
        self,
        method: str,
        server_name: str,
        path: str,
        json: Any,
        cookies: dict[str, str] | None,
        timeout: aiohttp.ClientTimeout | None,
    ) -> ServerReply:
        headers = {"Cookie": cookie_header(cookies)} if cookies else None
        session_cookie = (cookies or {}).get(session_cookie_name(server_name))
        response = await self.send(server_name, path, method, session_cookie, json=json, headers=headers, timeout=timeout or DEFAULT_TIMEOUT)
        return await ServerReply.read(response)


def cookie_header(cookies: dict[str, str]) -> str:
    return "; ".join(f"{key}={value}" for key, value in cookies.items())
