"""The owner pool reads a session's owner from its cookie without the secret; requests without one are not steered."""

from __future__ import annotations

import pytest
from fastapi import FastAPI, Request

from nemo_gym.client.owner_pool import cookie_owner
from nemo_gym.client.reading import ReadingClient
from nemo_gym.config import Instance, free_port
from nemo_gym.sessions.worker import OWNER_KEY
from tests.unit_tests.in_process_server import serving
from tests.session_cookies import signed_session

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
