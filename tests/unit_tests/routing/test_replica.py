"""Replica identity and a replica set's routing: the replicas of one server (same name and session_secret), each on
its own forwarding port.

The owner a replica stamps (worker, replica, forwarding port) reads back the same in the router and in the app.
Property-based: for any worker ID, replica host (IPv4, IPv6, DNS name) and ports, a session that the
app's session layer stamps and signs is read by the router (``OwnerReader``: the cookie, or the MCP
token minted for it) and by the app's own session layer, and both name the same owner, replica and
forwarding address. A replica listed in an instance's ``replicas`` setting at that address is known, in
Gym's client, by the same address (read by the setting's check, then by the client's URL parser).

A replica set's settings: advertise_host, forward_port, peer_dead_after_seconds, TLS between replicas and replicas are
known keys, a bad replicas list is refused at load, and a replica no other replica could reach, or whose forwarding port
is taken, does not start.

Two in-process replicas of two workers each, on loopback (``replica_sets``): a session's requests reach its owner
worker from any worker of any replica, an MCP token alone too, and a session whose worker is gone gets its 410 (or is
adopted, when durable) from its own replica.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import socket
from unittest import mock

import pytest
import yarl
from hypothesis import given, settings
from hypothesis import strategies as st
from itsdangerous import TimestampSigner
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from nemo_gym import SESSION_ID_KEY
from nemo_gym.base_resources_server import BaseResourcesServerConfig
from nemo_gym.config import ConfigError
from nemo_gym.process import discovery
from nemo_gym.process.run import claim_replica_port
from nemo_gym.routing.owner import OwnerReader, owner_of
from nemo_gym.routing.replica import (
    FORWARD_PORT_KEY,
    REPLICA_KEY,
    WILDCARD_HOSTS,
    ReplicaAddressError,
    advertised_host,
    forward_address,
    other_replica_urls,
    parse_replica,
    replica_address,
    replica_keys,
    replica_of,
    replica_urls,
)
from nemo_gym.sessions.cookie import SessionCookie, SessionIdMiddleware
from nemo_gym.sessions.token import TOKEN_HEADER, TOKEN_HEADER_KEY, mint_token, token_serializer
from nemo_gym.sessions.worker import OWNER_KEY
from resources_servers.example_session_state_mgmt.app import CounterServer
from tests.unit_tests.routing.replica_sets import count_of, replica_set, session, two_replicas  # noqa: F401 (fixture)
from tests.unit_tests.routing_workers import EchoServer, Worker, new_session

SECRET = "p" * 40
OPTIONS = {"secret_key": SECRET, "session_cookie": "prop_session"}
SERIALIZER = token_serializer(SECRET)

workers = st.text(alphabet="0123456789abcdef", min_size=16, max_size=16)
labels = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
hosts = st.one_of(
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(str),
    st.lists(labels, min_size=1, max_size=4).map(".".join),
)
ports = st.integers(min_value=1, max_value=65535)


async def stamped_cookie(worker: str, keys: dict) -> str:
    """The Set-Cookie value the app's session layer sends for a new session of ``worker`` of this replica."""
    sent = []

    async def reply(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def keep(message):
        sent.append(message)

    app = SessionCookie(SessionIdMiddleware(reply, owner=worker, replica=keys), **OPTIONS)
    await app({"type": "http", "headers": []}, None, keep)
    [cookie] = [value for name, value in sent[0]["headers"] if name == b"set-cookie"]
    return cookie.decode().split(";")[0].split("=", 1)[1]


@settings(max_examples=300, deadline=None)
@given(worker=workers, host=hosts, port=ports, forward_port=ports)
def test_the_router_and_the_app_read_the_same_owner_replica_and_forwarding_port(worker, host, port, forward_port):
    replica = replica_address(host, port)
    assert parse_replica(replica) == (host, port)
    keys = replica_keys(replica, forward_port)
    cookie = asyncio.run(stamped_cookie(worker, keys))
    headers = [(b"cookie", f"prop_session={cookie}".encode())]
    by_router = OwnerReader(OPTIONS, SERIALIZER).named_session({"type": "http", "path": "/x", "headers": headers})
    by_app = SessionCookie(None, **OPTIONS).read(headers)
    token = mint_token(SERIALIZER, by_app[SESSION_ID_KEY], worker, keys)
    by_token = OwnerReader(OPTIONS, SERIALIZER).named_session({"type": "http", "path": "/mcp", "headers": [(TOKEN_HEADER_KEY, token.encode())]})
    for session in (by_router, by_app, by_token):
        assert owner_of(session) == worker
        assert replica_of(session) == replica
        assert forward_address(session) == replica_address(host, forward_port)


@settings(max_examples=300, deadline=None)
@given(host=hosts.filter(lambda host: host not in WILDCARD_HOSTS), port=ports, scheme=st.sampled_from(["http", "https"]))
def test_a_listed_replica_is_known_to_gyms_client_by_the_address_its_sessions_name(host, port, scheme):
    address = replica_address(host, port)
    [listed] = replica_urls([f"{scheme}://{address}"])
    root = yarl.URL(listed)
    assert (root.scheme, replica_address(root.host, root.port)) == (scheme, address)


BASE = {"name": "counter", "host": "127.0.0.1", "port": 18080, "num_workers": 2, "session_secret": "s" * 40}


def test_the_replica_settings_are_known_keys_with_stated_defaults(caplog):
    settings = {**BASE, "advertise_host": "10.0.0.2", "forward_port": 18181, "peer_dead_after_seconds": 5}
    with caplog.at_level(logging.WARNING):
        config = BaseResourcesServerConfig.model_validate(settings)
    assert "ignoring keys" not in caplog.text
    assert (config.advertise_host, config.forward_port, config.peer_dead_after_seconds) == ("10.0.0.2", 18181, 5)
    defaults = BaseResourcesServerConfig.model_validate(BASE)
    assert (defaults.advertise_host, defaults.forward_port, defaults.peer_dead_after_seconds) == (None, None, 30.0)


def test_tls_between_replicas_needs_all_three_files():
    with pytest.raises(ValidationError, match="replica_tls_ca_file"):
        BaseResourcesServerConfig.model_validate({**BASE, "replica_tls_certfile": "c.pem", "replica_tls_keyfile": "k.pem"})


def test_a_wildcard_host_is_advertised_only_as_advertise_host():
    assert advertised_host("0.0.0.0", "10.0.0.2") == "10.0.0.2"
    assert advertised_host("10.0.0.3", None) == "10.0.0.3"
    with pytest.raises(ReplicaAddressError, match="advertise_host"):
        advertised_host("0.0.0.0", None)


def test_a_replica_on_a_wildcard_host_without_advertise_host_does_not_start():
    config = BaseResourcesServerConfig.model_validate({**BASE, "host": "0.0.0.0"})
    with pytest.raises(SystemExit, match="advertise_host"):
        claim_replica_port(config, "counter")


def test_a_replica_whose_forwarding_port_is_taken_does_not_start():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = BaseResourcesServerConfig.model_validate({**BASE, "forward_port": taken.getsockname()[1]})
        with pytest.raises(SystemExit, match="forwarding port"):
            claim_replica_port(config, "counter")


def test_a_config_without_a_session_secret_dumps_without_the_key_so_a_redacted_dump_validates_again():
    # Upstream servers (anyterminal_agent's _safe_config_json) dump their config, replace every *secret* key's
    # value with "***" and validate it again; an unset session_secret must not be there to be replaced.
    config = BaseResourcesServerConfig(**{key: value for key, value in BASE.items() if key != "session_secret"})
    dumped = config.model_dump(mode="json")
    assert "session_secret" not in dumped
    assert BaseResourcesServerConfig.model_validate({**dumped, **{key: "***" for key in dumped if "secret" in key}}) == config
    assert BaseResourcesServerConfig(**BASE).model_dump()["session_secret"] == "s" * 40


def test_replicas_is_a_known_key_listing_root_urls_with_their_ports(caplog):
    with caplog.at_level(logging.WARNING):
        config = BaseResourcesServerConfig.model_validate({**BASE, "replicas": ["http://10.0.0.2:18080", "HTTPS://Replica-3.Example/", "http://[fd00::4]"]})
    assert "ignoring keys" not in caplog.text
    assert config.replicas == ["http://10.0.0.2:18080", "https://replica-3.example:443", "http://[fd00::4]:80"]
    assert BaseResourcesServerConfig.model_validate(BASE).replicas == []


COUNTER = "counter:\n  resources_servers:\n    example_session_state_mgmt:\n      num_workers: 2\n      replicas: {}\n"


@pytest.mark.parametrize(
    "value",
    [
        '"http://10.0.0.2:18080"',
        "[ftp://10.0.0.2:18080]",
        "[10.0.0.2:18080]",
        "[http://10.0.0.2:18080/counter]",
        "['http://10.0.0.2:18080?x=1']",
        "[http://user@10.0.0.2:18080]",
        "[http://10.0.0.2:99999]",
        "[http://bad_host:18080]",
        "[http://0.0.0.0:18080]",
        "[http:///]",
        "[12]",
        "[http://10.0.0.2:18080, http://10.0.0.2:18080]",
        "[http://replica:80, HTTP://REPLICA/]",
    ],
)
def test_a_bad_replicas_value_is_refused_at_load_naming_the_key(tmp_path, value):
    path = tmp_path / "counter.yaml"
    path.write_text(COUNTER.format(value))
    with pytest.raises(ConfigError, match=r"counter\.resources_servers\.example_session_state_mgmt\.replicas"):
        discovery.load([path], check_ports=False)


def test_a_listed_replica_at_the_instances_own_address_is_the_instance_itself():
    settings = {"host": "0.0.0.0", "advertise_host": "10.0.0.1", "port": 18080, "replicas": ["http://10.0.0.1:18080", "http://10.0.0.2:18080"]}
    assert other_replica_urls(settings) == ["http://10.0.0.2:18080"]
    assert other_replica_urls({"host": "10.0.0.2", "port": 18080, "replicas": ["http://10.0.0.2:18080/"]}) == []
    assert other_replica_urls({"host": "127.0.0.1", "port": 1}) == []


@pytest.mark.anyio
async def test_a_session_names_its_replica_and_its_worker(two_replicas):
    (r1, r2), caller = two_replicas
    a1 = r1.workers[0]
    cookies = await new_session(caller, a1)
    assert session(a1, cookies)[OWNER_KEY] == a1.server.worker_id
    assert session(a1, cookies)[REPLICA_KEY] == r1.address == f"127.0.0.1:{a1.server.config.port}"
    assert session(a1, cookies)[FORWARD_PORT_KEY] == r1.claim.getsockname()[1]
    assert r1.address != r2.address
    assert all(worker.server.replica == r1.address for worker in r1.workers)


@pytest.mark.anyio
async def test_a_session_of_another_replica_reaches_its_owner_worker_from_every_worker(two_replicas):
    (r1, r2), caller = two_replicas
    for owner in r1.workers:
        cookies = await new_session(caller, owner)
        counts = []
        for entry in [*r2.workers, *r2.workers, *r1.workers]:
            response = await caller.post(entry, "/increment", cookies)
            body = await response.json()
            assert body["worker"] == owner.server.worker_id
            counts.append(body["count"])
        assert counts == list(range(2, 2 + len(counts)))


@pytest.mark.anyio
async def test_a_session_of_this_replica_takes_the_unix_path_and_never_the_forwarding_port(two_replicas):
    (r1, r2), caller = two_replicas
    a1, b1 = r1.workers
    cookies = await new_session(caller, a1)
    assert await count_of(caller, b1, cookies) == 2
    assert b1.server.replicas.pools == {}
    assert list(b1.server.transport.pools) == [a1.server.worker_id]


@pytest.mark.anyio
async def test_an_mcp_token_alone_reaches_its_owner_on_another_replica(two_replicas):
    (r1, r2), caller = two_replicas
    a1 = r1.workers[0]
    cookies = await new_session(caller, a1)
    session_id = session(a1, cookies)[SESSION_ID_KEY]
    token = mint_token(a1.server.tokens, session_id, a1.server.worker_id, a1.server.replica_keys)
    response = await caller.post(r2.workers[1], "/echo/x", headers={TOKEN_HEADER: token})
    assert (await response.json())["worker"] == a1.server.worker_id


@pytest.mark.anyio
async def test_a_token_of_another_instance_that_shares_the_secret_value_is_refused_not_served_by_its_owner():
    """Two instances (replica sets of one replica), one session_secret value: X's MCP token, sent to Y's /mcp, is not
    forwarded to X's forwarding port and served with X's session, but refused; at X itself it serves X's session."""
    secret = secrets.token_urlsafe(32)
    settings = {"server_class": CounterServer, "count": 1, "secret": secret, "expose_tools_over_mcp": True}
    async with replica_set(**settings) as ([x], caller), replica_set(**settings) as ([y], _):
        seeded = await caller.post(x.workers[0], "/seed_session", json={"initial_count": 100})
        assert seeded.status == 200, await seeded.text()
        token = (await seeded.json())["mcp"]["headers"][TOKEN_HEADER]
        assert await counter_over_mcp(x.workers[1], token) == 100
        for worker in y.workers:
            refusal = await counter_over_mcp(worker, token)
            assert f"not a session token signed by {y.workers[0].server.name}" in refusal


async def counter_over_mcp(worker: Worker, token: str) -> int | str:
    """The counter of the token's session, read with the official MCP client through ``worker``; or the refusal."""
    async with (
        create_mcp_http_client(headers={TOKEN_HEADER: token}) as http,
        streamable_http_client(worker.url + "/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        try:
            result = await session.call_tool("get_counter_value", {})
        except MCPError as refusal:
            return str(refusal)
    assert not result.is_error, result
    return json.loads(result.content[0].text)["count"]


@pytest.mark.anyio
async def test_a_streamed_body_and_reply_cross_replicas_whole(two_replicas):
    (r1, r2), caller = two_replicas
    a1 = r1.workers[0]
    cookies = await new_session(caller, a1)
    payload = os.urandom(300_000)

    async def chunks():
        for start in range(0, len(payload), 7000):
            yield payload[start : start + 7000]

    response = await caller.post(r2.workers[0], "/stream", cookies, data=chunks())
    assert response.headers["x-worker"] == a1.server.worker_id
    assert await response.read() == payload


@pytest.mark.anyio
async def test_a_session_whose_worker_is_gone_on_a_live_replica_gets_410_from_that_replica(two_replicas):
    (r1, r2), caller = two_replicas
    a1 = r1.workers[0]
    cookies = await new_session(caller, a1)
    await a1.stop()
    response = await caller.post(r2.workers[0], "/increment", cookies)
    assert response.status == 410
    assert a1.server.worker_id in (await response.json())["detail"]


@pytest.mark.anyio
async def test_a_durable_session_whose_worker_is_gone_on_a_live_replica_is_adopted_within_that_host(tmp_path):
    async with replica_set(server_class=CounterServer, session_store=str(tmp_path / "store.sqlite")) as ((r1, r2), caller):
        a1, b1 = r1.workers
        response = await caller.post(a1, "/seed_session", json={"initial_count": 5})
        cookies = {key: morsel.value for key, morsel in response.cookies.items()}
        await a1.stop()
        response = await caller.post(r2.workers[0], "/increment_counter", cookies, json={"count": 1})
        assert response.status == 200, await response.text()
        adopted = {key: morsel.value for key, morsel in response.cookies.items()}
        assert session(b1, adopted)[OWNER_KEY] == b1.server.worker_id and session(b1, adopted)[REPLICA_KEY] == r1.address
        response = await caller.post(r2.workers[1], "/get_counter_value", adopted, json={})
        assert (await response.json())["count"] == 6


@pytest.mark.anyio
async def test_a_request_crossing_replicas_has_its_cookie_verified_once_whichever_worker_of_the_other_replica_owns_it():
    """The sending worker's reading of the cookie travels with the request, bound by the replica credential."""
    async with replica_set() as ((r1, r2), caller):
        for owner in r1.workers:
            cookies = await new_session(caller, owner)
            with mock.patch.object(TimestampSigner, "unsign", autospec=True, side_effect=TimestampSigner.unsign) as unsign:
                body = await (await caller.post(r2.workers[0], "/echo/x", cookies)).json()
            assert (body["worker"], body["session_id"]) == (owner.server.worker_id, session(owner, cookies)[SESSION_ID_KEY])
            assert unsign.call_count == 1, owner


@pytest.mark.anyio
async def test_a_caller_that_leaves_a_request_sent_across_replicas_cancels_its_owners_handler_whichever_worker_of_the_other_replica_owns_it():
    async with replica_set() as ((r1, r2), caller):
        for owner in r1.workers:
            cookies = await new_session(caller, owner)
            session_id = session(owner, cookies)[SESSION_ID_KEY]
            request = asyncio.ensure_future(caller.post(r2.workers[0], "/hang", cookies))
            await asyncio.sleep(0.5)
            request.cancel()  # the caller goes away mid-request
            async with asyncio.timeout(10):
                while session_id not in EchoServer.cancelled:
                    await asyncio.sleep(0.05)

