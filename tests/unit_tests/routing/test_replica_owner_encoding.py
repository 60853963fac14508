"""The owner a replica stamps (worker, replica, forwarding port) reads back the same in the router and in the app.

Property-based: for any worker ID, replica host (IPv4, IPv6, DNS name) and ports, a session that the
app's session layer stamps and signs is read by the router (``OwnerReader``: the cookie, or the MCP
token minted for it) and by the app's own session layer, and both name the same owner, replica and
forwarding address. A replica listed in an instance's ``replicas`` setting at that address is known, in
Gym's client, by the same address (read by the setting's check, then by the client's URL parser).
"""

from __future__ import annotations

import asyncio

import yarl
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_gym import SESSION_ID_KEY
from nemo_gym.routing.owner import OwnerReader, owner_of
from nemo_gym.routing.replica import WILDCARD_HOSTS, forward_address, parse_replica, replica_address, replica_keys, replica_of, replica_urls
from nemo_gym.sessions.cookie import SessionCookie, SessionIdMiddleware
from nemo_gym.sessions.token import TOKEN_HEADER_KEY, mint_token, token_serializer

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
