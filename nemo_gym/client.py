"""ServerClient: how one Gym server (or a rollout driver) calls another by instance name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp

from nemo_gym.config import Instance
from nemo_gym.owner_pool import OwnerPool
from nemo_gym.sessions import session_cookie_name

DEFAULT_TIMEOUT = aiohttp.ClientTimeout(total=600, sock_connect=10)


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


class ServerClient:
    """One pooled aiohttp session for the process, with no cookie jar.

    Every call names the target instance and passes the session's cookies explicitly, the way an agent
    that threads many sessions at once must. A call whose session cookie names an owner worker goes on
    a connection to that worker (``owner_pool``).
    """

    def __init__(self, instances: dict[str, Instance], limit: int = 0) -> None:
        self.instances = instances
        self.limit = limit
        self._session: aiohttp.ClientSession | None = None
        self.owner_pool = OwnerPool(timeout=DEFAULT_TIMEOUT)

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.limit),
                cookie_jar=aiohttp.DummyCookieJar(),
                timeout=DEFAULT_TIMEOUT,
            )
        return self._session

    def url(self, server_name: str, path: str) -> str:
        try:
            instance = self.instances[server_name]
        except KeyError:
            raise KeyError(f"no server instance named {server_name!r}") from None
        return f"{instance.url}{path}"

    async def post(
        self,
        server_name: str,
        path: str,
        json: Any = None,
        cookies: dict[str, str] | None = None,
        timeout: aiohttp.ClientTimeout | None = None,
    ) -> ServerReply:
        return await self.request("POST", server_name, path, json, cookies, timeout)

    async def get(self, server_name: str, path: str, cookies: dict[str, str] | None = None) -> ServerReply:
        return await self.request("GET", server_name, path, None, cookies, None)

    async def request(
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
        async with self.owner_pool.request(
            self.session(), server_name, session_cookie, method, self.url(server_name, path),
            json=json, headers=headers, timeout=timeout or DEFAULT_TIMEOUT,
        ) as response:
            text = await response.text()
            try:
                body = await response.json(content_type=None)
            except ValueError:
                body = None
            return ServerReply(response.status, body, {k: m.value for k, m in response.cookies.items()}, text)

    async def close(self) -> None:
        await self.owner_pool.close()
        if self._session is not None:
            await self._session.close()
            self._session = None


def cookie_header(cookies: dict[str, str]) -> str:
    return "; ".join(f"{key}={value}" for key, value in cookies.items())
