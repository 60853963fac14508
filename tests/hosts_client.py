"""The test client of the network-namespace hosts (tests/hosts.py), run inside the client's own host.

``python -m tests.hosts_client MODE JSON`` prints one JSON line, its result:

- ``episodes``: ``{"client", "url", "episodes"}``: counter episodes of one standard client
  (resources_servers/example_session_state_mgmt/standard_clients.py), a new connection per request;
  the list of their results.
- ``sessions``: ``{"url", "sessions", "seconds", "think"}`` (and optionally ``"verify": true``): seeds
  that many counter sessions and adds 1 to each (a new connection per request; session N with the client
  ``clients[N % len(clients)]``, default aiohttp passing its cookies: ``SESSION_CLIENTS``), prints
  ``ready``, waits for a line on stdin, then adds 1 to each session every ``think`` seconds for
  ``seconds``. A 503 is waited out (its Retry-After, at most ``think``) and the step tried again; a
  410 or any other status ends the session. Then each session not ended reads its count (and, with
  ``verify``, verifies with that count expected), each with 503s retried as above. Per session: its start, the Cookie header it sent last, each request's ``[path, status,
  Retry-After, detail]``, the monotonic time each reply came (``times``) and how long it took (``took``), the count read back and
  the verify's reward (``reward``, None without ``verify``; its status and detail if it got none). The read and the verify are
  sent again while answered 503 for ``seconds`` or ``PATIENCE_SECONDS``, whichever is longer. With ``"hold": true`` the counts are read
  only once a second line comes on stdin. With ``"report_seeded": true`` the line
  after ``ready`` is the JSON list of each session's Cookie header once seeded and added to.
- ``swe_sessions``: ``{"url", "sessions", "seconds", "think", "row", "path", "content"}``: swe_rebench sessions of
  one task row, each seeded and fixed (``content`` written to ``path``), then ``ready`` and the JSON list of
  their Cookie headers; on a line on stdin each verifies (under an ``Idempotency-Key`` of its own, which
  its retries keep), 503s retried as above for ``seconds``. Per
  session: ``steps``, ``times``, ``cookie`` as above and the verify's ``reward``.
- ``stale``: ``{"adopt_url", "stale_url", "cookies", "seconds"}``: per session, adds 1 at ``adopt_url``
  until it is served, then once at ``stale_url`` with the cookie it had before (stale), a 503 tried
  again at ``adopt_url``; each reply's ``[url, status, detail]`` and that retry's Cookie header.
- ``health``: ``{"urls", "seconds", "interval", "timeout"}``: ``GET /`` of each URL every ``interval`` for
  ``seconds``, each given ``timeout``; per URL, each GET's ``[seconds taken, status or the error]``.
- ``post``: per line on stdin, a request ``{"url", "path", "body", "cookies", "key", "client"}`` (``client``
  ``requests`` or ``httpx``, a new connection; ``key`` its Idempotency-Key, or None for none; or ``mcp``, the
  path a tool called with the official ``mcp`` client and the session ``token`` alone): one line per
  reply, ``{"status", "body", "cookies" (those sent, updated with those set), "replayed", "retry_after", "worker"}``.
- ``get``: ``{"urls", "requests"}``: to each URL in turn, that many GETs one after the other, each on a new
  connection; their bodies, a list per URL.
- ``refused``: ``{"urls", "timeout"}``: POSTs a seed request to each URL, each given ``timeout`` seconds;
  per URL its status, or the connection error.
- ``mcp``: ``{"url", "sequences"}``: counter sequences over MCP with only the session token, all at once
  (resources_servers/example_session_state_mgmt/mcp_sequences.py, the official ``mcp`` client); one
  bool per sequence, True when it ended with the right count.
- ``conversations``: ``{"url", "conversations"}``: two-turn memory_agent conversations, all at once
  (responses_api_agents/memory_agent/conversations.py), a new connection per request; their results.
- ``swe``: ``{"url", "rows", "concurrency", "timeout"}``: one episode per task row of the JSONL file
  ``rows`` (a path on the client's host) through the relay's ``/run``, ``concurrency`` at a time,
  a new connection per request, each given ``timeout`` seconds; their results.

Every mode but ``get`` sends to ``url`` (the balancer) whichever instance a call names, with no cookie
jar: a call carries the cookies it is given, and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
import time
import urllib.request
import uuid
from http.cookies import SimpleCookie
from typing import Any

import aiohttp
import httpx
import requests

from nemo_gym.client.reading import ServerReply, cookie_header
from nemo_gym.durable.replies import REPLAYED_HEADER
from nemo_gym.routing.request_id import ID_HEADER_NAME
from nemo_gym.sessions.worker import WORKER_HEADER
from nemo_gym.sessions.token import TOKEN_HEADER
from nemo_gym.openai_utils import new_response
from nemo_gym.client.rollouts import read_rows, run_episodes as run_relay_episodes
from resources_servers.example_session_state_mgmt.standard_clients import CLIENTS, Reply, aiohttp_reply, run_episodes
from responses_api_agents.memory_agent.conversations import run_conversations

START = 1000
PATIENCE_SECONDS = 60


def verify_body() -> dict[str, Any]:
    """A counter /verify body but for its expected count."""
    return {"responses_create_params": {"input": "x"}, "response": new_response().model_dump(mode="json")}

REQUEST_TIMEOUT_SECONDS = 60


def episodes(client: str, url: str, episodes: int) -> list[dict[str, Any]]:
    return asyncio.run(run_episodes(CLIENTS[client], url, [START + number for number in range(episodes)], True, episodes))


def recorded(post, record: dict):
    """``step(path, body, headers=None)``: ``post`` it, the reply's ``[path, status, Retry-After, detail]``, its time and the Cookie
    header sent kept in ``record`` (``steps``, ``times``, ``cookie``); the reply."""

    async def step(path: str, body: dict, headers: dict[str, str] | None = None):
        began = time.monotonic()
        reply = await post(path, body, headers)
        record["took"].append(time.monotonic() - began)
        detail = reply.body.get("detail") if isinstance(reply.body, dict) else reply.body
        record["steps"].append([path, reply.status, reply.retry_after, detail])
        record["times"].append(time.monotonic())
        record["cookie"] = reply.sent_cookie or record["cookie"]
        return reply

    return step


async def tool_call(url: str, headers: dict[str, str], tool: str, arguments: dict) -> Reply:
    """One tool call with the official ``mcp`` client, a client session of its own: 200 and the tool's JSON; for a tool
    error, the status its route answered (``nemo_gym.mcp_tools.endpoint``) and what it said; else the HTTP status of
    the failed POST (500 if none failed) and what the client raised."""
    # Imported by the modes that speak MCP only: ``mcp`` is most of the client's start-up (1.7 s of 2.7 s of CPU),
    # which every run of the client on a host paid.
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from resources_servers.example_session_state_mgmt.mcp_sequences import mcp_http_client

    seen: list[httpx.Response] = []

    async def keep(response) -> None:
        seen.append(response)

    try:
        async with mcp_http_client(headers) as http:
            http.event_hooks["response"].append(keep)
            async with streamable_http_client(url + "/mcp", http_client=http) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                result = await session.call_tool(tool, arguments)
        if not result.is_error:
            return Reply(200, json.loads(result.content[0].text), None, [])
        detail: Any = result.content[0].text if result.content else "tool error"
        if answered := re.match(r"POST \S+ answered HTTP (\d+): ", detail):
            return Reply(int(answered[1]), {"detail": detail}, None, [])
    except Exception as error:  # the SDK raises what the transport or an error reply made (McpError, an ExceptionGroup)
        detail = repr(error)
    failed = [response for response in seen if response.status_code >= 400]
    status = failed[-1].status_code if failed else 500
    return Reply(status, {"detail": detail}, None, [], failed[-1].headers.get("Retry-After") if failed else None)


@contextlib.asynccontextmanager
async def mcp_token(url: str, fresh: bool):
    """Counter sessions as a CLI harness runs them over MCP: the seed over HTTP, then only the session token
    from its ``mcp`` metadata, no cookie; every other step a tool call (``tool_call``)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=fresh, limit=0), cookie_jar=aiohttp.DummyCookieJar()) as http:

        @contextlib.asynccontextmanager
        async def per_episode():
            headers: dict[str, str] = {}

            async def post(path: str, body: dict, extra: dict[str, str] | None = None) -> Reply:
                if path != "/seed_session":
                    return await tool_call(url, {**headers, **(extra or {})}, path.lstrip("/"), body)
                async with http.post(url + path, json=body, headers=extra) as reply:
                    seeded = aiohttp_reply(reply, await reply.text())
                if seeded.status == 200:
                    headers[TOKEN_HEADER] = seeded.body["mcp"]["headers"][TOKEN_HEADER]
                return seeded

            yield post

        yield per_episode


# The clients of ``sessions``: the standard ones, and MCP with the token alone.
SESSION_CLIENTS = {**CLIENTS, "mcp_token": mcp_token}


async def sessions(
    url: str,
    sessions: int,
    seconds: float,
    think: float,
    verify: bool = False,
    report_seeded: bool = False,
    hold: bool = False,
    clients: tuple[str, ...] = ("aiohttp_cookies",),
) -> list[dict[str, Any]]:
    # How long a read or a verify answered 503 is sent again: a bound (a loaded machine's store may refuse for a while), never an expectation.
    patience = max(seconds, PATIENCE_SECONDS)
    async with contextlib.AsyncExitStack() as opened:
        openers = [await opened.enter_async_context(SESSION_CLIENTS[name](url, True)) for name in clients]
        go, read = asyncio.Event(), asyncio.Event()

        async def one(start: int, ready: asyncio.Event) -> dict[str, Any]:
            async with openers[(start - START) % len(openers)]() as post:
                record: dict[str, Any] = {"start": start, "steps": [], "times": [], "took": [], "count": None, "cookie": None, "reward": None}

                step = recorded(post, record)

                async def sent_last(posted):
                    """The reply; the Cookie header it was sent with kept as the one sent last (a loaded machine may
                    fit one step after ``go``, whose reply's cookie only the read sends)."""
                    reply = await posted
                    record["cookie"] = reply.sent_cookie or record["cookie"]
                    return reply

                first = (await step("/seed_session", {"initial_count": start})).status == 200 and (await step("/increment_counter", {"count": 1})).status == 200
                seeded[start - START] = record["cookie"]
                ready.set()
                await go.wait()
                if not first:
                    return record
                began = time.monotonic()
                while time.monotonic() - began < seconds:
                    status = (await step("/increment_counter", {"count": 1})).status
                    if status == 503:
                        await asyncio.sleep(min(float(record["steps"][-1][2] or think), think))
                    elif status == 200:
                        await asyncio.sleep(think)
                    else:
                        return record
                await read.wait()
                began = time.monotonic()
                reply = await sent_last(post("/get_counter_value", {}))
                while reply.status == 503 and time.monotonic() - began < patience:  # waited out, as a client is told to
                    await asyncio.sleep(min(float(reply.retry_after or think), think))
                    reply = await sent_last(post("/get_counter_value", {}))
                record["count"] = reply.body.get("count") if reply.status == 200 else f"{reply.status}: {reply.body}"
                began = time.monotonic()
                while verify and reply.status == 200 and time.monotonic() - began < patience:
                    verified = await sent_last(post("/verify", {**verify_body(), "expected_count": record["count"]}))
                    record["reward"] = verified.body.get("reward") if verified.status == 200 else f"{verified.status}: {verified.body}"
                    if verified.status != 503:
                        break
                    await asyncio.sleep(min(float(verified.retry_after or think), think))
                return record

        flags = [asyncio.Event() for _ in range(sessions)]
        seeded: list[str | None] = [None] * sessions
        tasks = [asyncio.create_task(one(START + number, flag)) for number, flag in enumerate(flags)]
        await asyncio.gather(*(flag.wait() for flag in flags))
        print("ready", flush=True)
        if report_seeded:
            print(json.dumps(seeded), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        go.set()
        if hold:
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        read.set()
        return await asyncio.gather(*tasks)


async def swe_sessions(url: str, sessions: int, seconds: float, think: float, row: dict, path: str, content: str) -> list[dict[str, Any]]:
    """``sessions`` swe_rebench sessions of the task ``row``, all at once: each seeded and its fix (``content`` written
    to ``path``) applied; then ``ready`` and the JSON list of each session's Cookie header; on a line on stdin, each
    verifies under a key of its own, a 503 waited out (its Retry-After, at most ``think``) and tried again under the same
    key until ``seconds`` have passed.
    Per session: as ``sessions`` (``steps``, ``times``, ``cookie``) and the verify's ``reward``."""
    async with CLIENTS["aiohttp_cookies"](url, True) as open_session:
        go = asyncio.Event()

        async def one(number: int, ready: asyncio.Event) -> dict[str, Any]:
            async with open_session() as post:
                record: dict[str, Any] = {"steps": [], "times": [], "took": [], "cookie": None, "reward": None}
                step = recorded(post, record)
                fixed = (await step("/seed_session", row)).status == 200 and (await step("/write_file", {"path": path, "content": content})).status == 200
                seeded[number] = record["cookie"]
                ready.set()
                await go.wait()
                began = time.monotonic()
                once = {ID_HEADER_NAME: uuid.uuid4().hex}  # each try the same request, as Gym's client sends it
                while fixed and time.monotonic() - began < seconds:
                    verified = await step("/verify", {**row, "response": new_response().model_dump(mode="json")}, once)
                    if verified.status == 200:
                        record["reward"] = verified.body["reward"]
                    if verified.status != 503:
                        break
                    await asyncio.sleep(min(float(verified.retry_after or think), think))
                return record

        flags = [asyncio.Event() for _ in range(sessions)]
        seeded: list[str | None] = [None] * sessions
        tasks = [asyncio.create_task(one(number, flag)) for number, flag in enumerate(flags)]
        await asyncio.gather(*(flag.wait() for flag in flags))
        print("ready", flush=True)
        print(json.dumps(seeded), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        go.set()
        return await asyncio.gather(*tasks)


async def stale(adopt_url: str, stale_url: str, cookies: list[str], seconds: float) -> list[dict[str, Any]]:
    """Per session (a Cookie header each), all at once: adds 1 at ``adopt_url`` (a replica's own URL), each 503
    tried again after its Retry-After, until a 200 or ``seconds`` are over; then adds 1 at ``stale_url`` (the
    replica the cookie names, frozen) with the cookie as given (stale now), and a 503 is tried once more at
    ``adopt_url`` with the cookie that 503 set. Per session: each reply's ``[url, status, detail]``, and the
    Cookie header of that retry."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True, limit=0), cookie_jar=aiohttp.DummyCookieJar()) as http:

        async def add(target: str, cookie: str, record: dict) -> tuple[int, str | None, str]:
            timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS)
            async with http.post(target + "/increment_counter", json={"count": 1}, headers={"Cookie": cookie}, timeout=timeout) as reply:
                body = await reply.json(content_type=None)
                record["replies"].append([target, reply.status, body.get("detail") if isinstance(body, dict) else body])
                jar = {key: morsel.value for key, morsel in SimpleCookie(cookie).items()} | {key: morsel.value for key, morsel in reply.cookies.items()}
                return reply.status, reply.headers.get("Retry-After"), cookie_header(jar)

        async def one(cookie: str) -> dict[str, Any]:
            record: dict[str, Any] = {"replies": [], "retry_cookie": None}
            began = time.monotonic()
            while time.monotonic() - began < seconds:
                status, retry_after, _ = await add(adopt_url, cookie, record)
                if status != 503:
                    break
                await asyncio.sleep(float(retry_after or 1))
            status, _, given = await add(stale_url, cookie, record)
            if status == 503:
                record["retry_cookie"] = given
                await add(adopt_url, given, record)
            return record

        return list(await asyncio.gather(*(one(cookie) for cookie in cookies)))


async def health(urls: list[str], seconds: float, interval: float, timeout: float) -> dict[str, list]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:

        async def probe(url: str) -> list:
            answers = []
            began = time.monotonic()
            while time.monotonic() - began < seconds:
                sent = time.monotonic()
                try:
                    async with http.get(url + "/", timeout=aiohttp.ClientTimeout(total=timeout)) as reply:
                        await reply.read()
                        outcome: Any = reply.status
                except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as error:
                    outcome = repr(error)
                answers.append([time.monotonic() - sent, outcome])
                await asyncio.sleep(interval)
            return answers

        return dict(zip(urls, await asyncio.gather(*(probe(url) for url in urls))))


def post_lines() -> None:
    for line in sys.stdin:
        call = json.loads(line)
        headers = {"Connection": "close"} | ({ID_HEADER_NAME: call["key"]} if call.get("key") else {})
        target = call["url"] + call["path"]
        if call["client"] == "mcp":
            tool = asyncio.run(tool_call(call["url"], {TOKEN_HEADER: call["token"]}, call["path"].lstrip("/"), call["body"]))
            answer = {"status": tool.status, "body": tool.body, "cookies": call["cookies"], "replayed": None, "retry_after": tool.retry_after, "worker": None}
            print(json.dumps(answer), flush=True)
            continue
        if call["client"] == "requests":
            reply: Any = requests.post(target, json=call["body"], cookies=call["cookies"], headers=headers, timeout=REQUEST_TIMEOUT_SECONDS)
            given = reply.cookies.get_dict()
        else:
            with httpx.Client(cookies=call["cookies"], timeout=REQUEST_TIMEOUT_SECONDS) as http:
                reply = http.post(target, json=call["body"], headers=headers)
                given = dict(reply.cookies)
        answer = {
            "status": reply.status_code,
            "body": reply.json() if reply.headers.get("content-type", "").startswith("application/json") else reply.text,
            "cookies": {**call["cookies"], **given},
            "replayed": reply.headers.get(REPLAYED_HEADER),
            "retry_after": reply.headers.get("Retry-After"),
            "worker": reply.headers.get(WORKER_HEADER),
        }
        print(json.dumps(answer), flush=True)


def get(urls: list[str], requests: int) -> list[list[str]]:
    bodies: list[list[str]] = []
    for url in urls:
        bodies.append([])
        for _ in range(requests):
            with urllib.request.urlopen(url, timeout=REQUEST_TIMEOUT_SECONDS) as reply:
                bodies[-1].append(reply.read().decode())
    return bodies


async def refused(urls: list[str], timeout: float) -> dict[str, Any]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:

        async def one(url: str) -> Any:
            try:
                async with http.post(url + "/seed_session", json={"initial_count": START}, timeout=aiohttp.ClientTimeout(total=timeout)) as reply:
                    return reply.status
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as error:
                return repr(error)

        return dict(zip(urls, await asyncio.gather(*(one(url) for url in urls))))


class BalancerClient:
    """The calls of ``ReadingClient`` (``post``, ``url``), every one to the balancer at ``url`` on a new
    connection, with only the cookies it is given: the instance a call names only says what it is for."""

    def __init__(self, url: str, timeout: float = REQUEST_TIMEOUT_SECONDS) -> None:
        self.base = url
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True), cookie_jar=aiohttp.DummyCookieJar())

    def url(self, server: str, path: str) -> str:
        return self.base + path

    async def post(self, server: str, path: str, json: Any = None, cookies: dict[str, str] | None = None) -> ServerReply:
        headers = {"Cookie": cookie_header(cookies)} if cookies else None
        return await ServerReply.read(await self.http.post(self.base + path, json=json, headers=headers, timeout=self.timeout))

    async def close(self) -> None:
        await self.http.close()


async def through_balancer(url: str, run, timeout: float = REQUEST_TIMEOUT_SECONDS) -> Any:
    client = BalancerClient(url, timeout)
    try:
        return await run(client)
    finally:
        await client.close()


def main() -> None:
    mode, args = sys.argv[1], json.loads(sys.argv[2])
    if mode == "episodes":
        result: Any = episodes(**args)
    elif mode == "sessions":
        result = asyncio.run(sessions(**args))
    elif mode == "swe_sessions":
        result = asyncio.run(swe_sessions(**args))
    elif mode == "stale":
        result = asyncio.run(stale(**args))
    elif mode == "get":
        result = get(**args)
    elif mode == "health":
        result = asyncio.run(health(**args))
    elif mode == "post":
        post_lines()
        return
    elif mode == "mcp":
        from resources_servers.example_session_state_mgmt.mcp_sequences import run_sequences  # as ``tool_call``'s imports

        result = asyncio.run(through_balancer(args["url"], lambda client: run_sequences(client, "counter", args["sequences"])))
    elif mode == "conversations":
        count = args["conversations"]
        result = asyncio.run(through_balancer(args["url"], lambda client: run_conversations(client, "memory_agent", count, count)))
    elif mode == "swe":
        rows = read_rows(args["rows"])
        result = asyncio.run(through_balancer(args["url"], lambda client: run_relay_episodes(client, "relay", rows, args["concurrency"], False), args["timeout"]))
    else:
        result = asyncio.run(refused(**args))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
