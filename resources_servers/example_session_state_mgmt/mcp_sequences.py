"""Counter sequences over MCP, as a CLI harness in a sandbox runs them: only the session token, no cookie.

Each sequence seeds a session over HTTP and keeps only the token from the reply's ``mcp`` metadata,
then, with the official MCP client, adds 1 and 2 and reads the counter. Used by the end-to-end tests
and by ``scripts/multiworker_report.py --mcp``.
"""

from __future__ import annotations

import asyncio
import json

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT

from nemo_gym.client.reading import ReadingClient
from nemo_gym.sessions.token import TOKEN_HEADER
from resources_servers.example_session_state_mgmt.standard_clients import shared_tls

# To connect, write or wait for a pooled connection: the SDK's 30 s ran out for one of 200 sequences started at once
# through a balancer on a loaded 2-core machine; reads keep the SDK's bound for a held stream.
CONNECT_SECONDS = 120
FIRST_START = 100  # not 0: a counter missing on another worker also reads as 0


def mcp_http_client(headers: dict[str, str], timeout: httpx2.Timeout | None = None) -> httpx2.AsyncClient:
    """The SDK's client (``create_mcp_http_client``: its timeouts, no redirects followed) with the TLS context every
    client here shares (``standard_clients.shared_tls``), which the SDK's factory takes no argument for."""
    return httpx2.AsyncClient(headers=headers, timeout=timeout or httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT), verify=shared_tls())


async def one_sequence(client: ReadingClient, server: str, start: int) -> int | None:
    """Seed at ``start``, add 1 then 2 over ``/mcp``; the count the server reports, or None if it has none.

    An error names the sequence and every HTTP error reply its MCP client got: the SDK turns a reply of 400 or
    more into "Server returned an error response" and keeps neither its status nor its body."""
    seed = await client.post(server, "/seed_session", json={"initial_count": start})
    if not seed.ok:
        raise RuntimeError(f"{server}/seed_session answered {seed.status}: {seed.text}")
    token = seed.body["mcp"]["headers"][TOKEN_HEADER]
    refused: list[str] = []

    async def note_refusal(response: httpx2.Response) -> None:
        if response.status_code >= 400:
            body = (await response.aread())[:300].decode(errors="replace")
            refused.append(f"{response.request.method} {response.status_code} {body!r}")

    try:
        async with (
            mcp_http_client({TOKEN_HEADER: token}, httpx2.Timeout(CONNECT_SECONDS, read=MCP_DEFAULT_SSE_READ_TIMEOUT)) as http,
            streamable_http_client(client.url(server, "/mcp"), http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            http.event_hooks["response"].append(note_refusal)
            await session.initialize()
            await session.call_tool("increment_counter", {"count": 1})
            await asyncio.sleep(0.02)  # think time between steps, as a model takes
            await session.call_tool("increment_counter", {"count": 2})
            result = await session.call_tool("get_counter_value", {})
    except Exception as error:
        raise RuntimeError(f"the sequence seeded at {start} failed: {error!r}; HTTP errors it was answered: {refused}") from error
    return None if result.is_error else json.loads(result.content[0].text)["count"]


async def run_sequences(client: ReadingClient, server: str, count: int) -> list[bool]:
    """Run ``count`` sequences at once; each is True when it ended with the right count. If any raised, every one
    that did is named in one error, after all have ended."""
    starts = [FIRST_START + number for number in range(count)]
    counts = await asyncio.gather(*(one_sequence(client, server, start) for start in starts), return_exceptions=True)
    errors = [found for found in counts if isinstance(found, BaseException)]
    if errors:
        raise RuntimeError(f"{len(errors)} of {count} sequences raised:\n" + "\n".join(str(error) for error in errors))
    return [found == start + 3 for start, found in zip(starts, counts)]
