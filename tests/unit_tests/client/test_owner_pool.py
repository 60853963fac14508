"""The owner pool reads a session's owner from its cookie without the secret; requests without one are not steered.
Across a replica set, Gym's client sends a session straight to its owner replica, or to the URL it was given when
the owner replica takes no connection from it.
"""

from __future__ import annotations

import aiohttp
import pytest
from fastapi import FastAPI, Request

from nemo_gym.client.owner_pool import OwnerPool, cookie_owner
from nemo_gym.client.reading import ReadingClient, cookie_header
from nemo_gym.config import Instance, free_port
from nemo_gym.sessions.worker import OWNER_KEY, WORKER_HEADER
from tests.session_cookies import signed_session
from tests.unit_tests.in_process_server import serving
from tests.unit_tests.routing.replica_sets import two_replicas  # noqa: F401 (fixture)
from tests.unit_tests.routing_workers import Worker, new_session

WORKER = "0123456789abcdef"


def test_the_owner_is_read_from_a_signed_cookie_without_its_secret():
    assert cookie_owner(signed_session("any secret", {"session_id": "s", OWNER_KEY: WORKER})) == WORKER


@pytest.mark.parametrize(
    "cookie",
    [
        None,
        "",
        "garbage",
        "not base64!.123.sig",
        signed_session("s", {"session_id": "s"}),
        signed_session("s", {OWNER_KEY: "../../etc/passwd"}),
        signed_session("s", {OWNER_KEY: 12}),
        signed_session("s", ["a", "list"]),
    ],
    # A signed cookie holds its signing time: its id would differ between two collections of one run.
    ids=["none", "empty", "garbage", "not-base64", "no-owner", "path-owner", "number-owner", "list"],
)
def test_a_cookie_that_names_no_worker_names_no_owner(cookie):
    assert cookie_owner(cookie) is None


@pytest.mark.anyio
async def test_a_server_that_labels_nothing_gets_every_call_and_keeps_one_connection():
    """A session cookie with an owner, sent to a server without routing: calls arrive, on a reused connection."""
    app = FastAPI()

    @app.post("/where")
    async def where(request: Request) -> dict:
        return {"client_port": request.client.port, "cookie": request.cookies.get("plain_session")}

    port = free_port()
    client = ReadingClient({"plain": Instance("plain", "resources_servers", "example_session_state_mgmt", {"host": "127.0.0.1", "port": port})})
    cookie = signed_session("s", {"session_id": "s", OWNER_KEY: WORKER})
    async with serving(app, port):
        try:
            replies = [await client.post("plain", "/where", cookies={"plain_session": cookie}) for _ in range(5)]
            assert [reply.body["cookie"] for reply in replies] == [cookie] * 5
            assert len({reply.body["client_port"] for reply in replies}) == 1
            assert len(client.owner_pool.servers["plain"].connections) == 1
        finally:
            await client.close()


async def pool_increments(pool: OwnerPool, url: str, server: Worker, cookies: dict[str, str], times: int) -> list[tuple[str, int]]:
    """Gym's owner pool sends ``/increment`` for the session, given ``url``: (worker that answered, count) each time."""
    answers = []
    async with aiohttp.ClientSession() as shared:
        for _ in range(times):
            response = await pool.request(
                shared, server.server.name, cookies[server.server.session_cookie], "POST", url + "/increment", headers={"Cookie": cookie_header(cookies)}
            )
            answers.append((response.headers[WORKER_HEADER], (await response.json())["count"]))
    await pool.close()
    return answers


@pytest.mark.anyio
async def test_gyms_client_sends_a_session_straight_to_its_owner_replica(two_replicas):
    (r1, r2), caller = two_replicas
    a1 = r1.workers[0]
    cookies = await new_session(caller, a1)
    answers = await pool_increments(OwnerPool(), r2.workers[0].url, a1, cookies, 4)
    assert answers == [(a1.server.worker_id, count) for count in range(2, 6)]  # answered by the owner itself: no hop
    assert all(worker.server.replicas.pools == {} for worker in r2.workers)  # nothing crossed from the other replica


@pytest.mark.anyio
async def test_gyms_client_sends_to_the_url_it_was_given_when_the_owner_replica_takes_no_connection_from_it(two_replicas):
    (r1, r2), caller = two_replicas
    a1, b1 = r1.workers
    cookies = await new_session(caller, b1)
    await a1.stop()  # the replica's public address takes no connection now; its forwarding port still does (b1)
    r2_entry = r2.workers[1]
    pool = OwnerPool()
    answers = await pool_increments(pool, r2_entry.url, b1, cookies, 2)
    assert answers == [(r2_entry.server.worker_id, 2), (r2_entry.server.worker_id, 3)]
    assert r1.address in pool.unreachable  # tried once, then not again for a while
