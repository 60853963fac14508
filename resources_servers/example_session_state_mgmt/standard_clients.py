"""Counter episodes driven by standard HTTP clients, each keeping the session cookie its own way.

An episode seeds a session at ``start``, adds 1, adds 2 and reads the count, which must be start + 3.
Each client keeps the cookie as its users would: aiohttp's own cookie jar (which quotes the value),
aiohttp's ``cookies=``, httpx's and requests' jars, the standard library's ``http.cookiejar`` with
urllib, the openai SDK's generic ``post`` (its httpx client keeps the cookies), and a client that
replaces its cookies with each reply's, even a reply that sets none (what upstream NeMo Gym's agents
do). ``fresh`` opens a new connection for every request, so consecutive requests of a session reach
whichever worker accepts; otherwise connections are kept alive. Each reply says which Cookie header
the client sent and which Set-Cookie headers it got, as read on the client's own request and reply.
A ``post`` takes extra request headers too (an ``Idempotency-Key``, say), sent as given.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http.cookiejar
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple, Protocol

import aiohttp
import httpx
import openai
import requests

THINK_SECONDS = 0.01
MAX_THREADS = 64


class Reply(NamedTuple):
    status: int
    body: Any
    sent_cookie: str | None  # the request's Cookie header, as the client sent it
    set_cookies: list[str]  # the reply's Set-Cookie headers
    retry_after: str | None = None  # the reply's Retry-After header


class Post(Protocol):
    def __call__(self, path: str, body: dict, headers: dict[str, str] | None = None) -> Awaitable[Reply]: ...


# A client: given the server's URL and whether to use fresh connections, opens what the whole run
# shares and yields a factory of per-episode ``post`` functions (each an async context manager).
Client = Callable[[str, bool], contextlib.AbstractAsyncContextManager[Callable[[], contextlib.AbstractAsyncContextManager[Post]]]]


def steps(start: int) -> list[tuple[str, dict]]:
    return [
        ("/seed_session", {"initial_count": start}),
        ("/increment_counter", {"count": 1}),
        ("/increment_counter", {"count": 2}),
        ("/get_counter_value", {}),
    ]


async def episode(post: Post, start: int) -> dict[str, Any]:
    """``{"reward": 1.0}`` when the count read back is start + 3; an ``"error"`` says which step failed."""
    body: Any = None
    for path, request in steps(start):
        reply = await post(path, request)
        status, body = reply.status, reply.body
        if status != 200:
            return {"reward": 0.0, "error": f"{path} answered {status}: {str(body)[:200]}"}
        await asyncio.sleep(THINK_SECONDS)
    return {"reward": 1.0 if body.get("count") == start + 3 else 0.0}


async def run_episodes(client: Client, url: str, starts: list[int], fresh: bool, concurrency: int) -> list[dict[str, Any]]:
    gate = asyncio.Semaphore(concurrency)
    async with client(url, fresh) as episode_post:

        async def one(start: int) -> dict[str, Any]:
            async with gate, episode_post() as post:
                try:
                    return await episode(post, start)
                except (OSError, aiohttp.ClientError, httpx.HTTPError, requests.RequestException, openai.APIConnectionError) as error:
                    return {"reward": 0.0, "error": repr(error)}

        return await asyncio.gather(*(one(start) for start in starts))


def decoded(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def aiohttp_reply(reply: aiohttp.ClientResponse, text: str) -> Reply:
    return Reply(reply.status, decoded(text), reply.request_info.headers.get("Cookie"), reply.headers.getall("Set-Cookie", []), reply.headers.get("Retry-After"))


def httpx_reply(reply: httpx.Response) -> Reply:
    return Reply(
        reply.status_code, decoded(reply.text), reply.request.headers.get("Cookie"), reply.headers.get_list("Set-Cookie"), reply.headers.get("Retry-After")
    )


@functools.cache
def shared_tls() -> ssl.SSLContext:
    """One TLS context for every httpx client made here (httpx's ``verify``), as an application keeps one client:
    httpx builds a new one, about 23 ms of CPU loading the CA bundle, for each client it makes otherwise."""
    return ssl.create_default_context()


def localhost(url: str) -> str:
    """aiohttp's default cookie jar keeps no cookie from an IP address, so its users name the host."""
    return url.replace("://127.0.0.1:", "://localhost:")


@contextlib.asynccontextmanager
async def aiohttp_jar(url: str, fresh: bool) -> AsyncIterator:
    @contextlib.asynccontextmanager
    async def per_episode() -> AsyncIterator[Post]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=fresh)) as http:

            async def post(path: str, body: dict, headers: dict[str, str] | None = None) -> Reply:
                async with http.post(localhost(url) + path, json=body, headers=headers) as reply:
                    return aiohttp_reply(reply, await reply.text())

            yield post

    yield per_episode


def shared_aiohttp(replace: bool) -> Client:
    """One pooled session for every episode, no jar; each episode passes its cookies with ``cookies=``."""

    @contextlib.asynccontextmanager
    async def client(url: str, fresh: bool) -> AsyncIterator:
        connector = aiohttp.TCPConnector(force_close=fresh, limit=0)
        async with aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar()) as http:

            @contextlib.asynccontextmanager
            async def per_episode() -> AsyncIterator[Post]:
                cookies: dict[str, str] = {}

                async def post(path: str, body: dict, headers: dict[str, str] | None = None) -> Reply:
                    nonlocal cookies
                    async with http.post(url + path, json=body, cookies=cookies, headers=headers) as reply:
                        given = {name: morsel.value for name, morsel in reply.cookies.items()}
                        cookies = given if replace else {**cookies, **given}
                        return aiohttp_reply(reply, await reply.text())

                yield post

            yield per_episode

    return client


@contextlib.asynccontextmanager
async def httpx_jar(url: str, fresh: bool) -> AsyncIterator:
    limits = httpx.Limits(max_keepalive_connections=0) if fresh else httpx.Limits()

    @contextlib.asynccontextmanager
    async def per_episode() -> AsyncIterator[Post]:
        async with httpx.AsyncClient(limits=limits, timeout=60, verify=shared_tls()) as http:

            async def post(path: str, body: dict, headers: dict[str, str] | None = None) -> Reply:
                return httpx_reply(await http.post(url + path, json=body, headers=headers))

            yield post

    yield per_episode


@contextlib.asynccontextmanager
async def openai_sdk(url: str, fresh: bool) -> AsyncIterator:
    """The SDK's own ``post`` for routes it has no method for; ``max_retries=0``, so every reply is seen."""
    limits = httpx.Limits(max_keepalive_connections=0) if fresh else httpx.Limits()

    @contextlib.asynccontextmanager
    async def per_episode() -> AsyncIterator[Post]:
        async with httpx.AsyncClient(limits=limits, timeout=60, verify=shared_tls()) as http:
            client = openai.AsyncOpenAI(base_url=url, api_key="unused", http_client=http, max_retries=0)

            async def post(path: str, body: dict, headers: dict[str, str] | None = None) -> Reply:
                try:
                    return httpx_reply(await client.post(path, body=body, cast_to=httpx.Response, options={"headers": headers or {}}))
                except openai.APIStatusError as error:
                    return httpx_reply(error.response)

            yield post

    yield per_episode


def threaded(open_episode: Callable[[str, bool], Callable[[str, dict, dict[str, str] | None], Reply]]) -> Client:
    """A blocking client, one episode per thread at a time; ``open_episode`` makes an episode's ``post``."""

    @contextlib.asynccontextmanager
    async def client(url: str, fresh: bool) -> AsyncIterator:
        with ThreadPoolExecutor(MAX_THREADS) as threads:
            loop = asyncio.get_running_loop()

            @contextlib.asynccontextmanager
            async def per_episode() -> AsyncIterator[Post]:
                blocking_post = open_episode(url, fresh)

                async def post(path: str, body: dict, headers: dict[str, str] | None = None) -> Reply:
                    return await loop.run_in_executor(threads, blocking_post, path, body, headers)

                yield post

            yield per_episode

    return client


def requests_session(url: str, fresh: bool) -> Callable[[str, dict, dict[str, str] | None], Reply]:
    http = requests.Session()
    if fresh:
        http.headers["Connection"] = "close"

    def post(path: str, body: dict, headers: dict[str, str] | None = None) -> Reply:
        reply = http.post(url + path, json=body, headers=headers, timeout=60)
        cookie = reply.request.headers.get("Cookie")
        return Reply(reply.status_code, decoded(reply.text), cookie, reply.raw.headers.getlist("Set-Cookie"), reply.headers.get("Retry-After"))

    return post


def urllib_cookiejar(url: str, fresh: bool) -> Callable[[str, dict, dict[str, str] | None], Reply]:
    """urllib opens a new connection for every request, fresh or not."""
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))

    def post(path: str, body: dict, headers: dict[str, str] | None = None) -> Reply:
        request = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with opener.open(request, timeout=60) as reply:
                status, text, headers = reply.status, reply.read().decode(), reply.headers
        except urllib.error.HTTPError as error:
            status, text, headers = error.code, error.read().decode(), error.headers
        return Reply(status, decoded(text), request.get_header("Cookie"), headers.get_all("Set-Cookie", []), headers.get("Retry-After"))

    return post


CLIENTS: dict[str, Client] = {
    "aiohttp_jar": aiohttp_jar,
    "aiohttp_cookies": shared_aiohttp(replace=False),
    "replacing": shared_aiohttp(replace=True),
    "httpx_jar": httpx_jar,
    "openai_sdk": openai_sdk,
    "requests_session": threaded(requests_session),
    "urllib_cookiejar": threaded(urllib_cookiejar),
}
