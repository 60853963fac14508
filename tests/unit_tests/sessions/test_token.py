"""nemo_gym.sessions.token: the MCP session token names its session (and owner, and replica) under the secret that
signed it; anything else read as a token is no session."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nemo_gym import SESSION_ID_KEY
from nemo_gym.sessions.token import TOKEN_HEADER_KEY, is_mcp_path, mint_token, read_token, token_serializer, token_session_id
from nemo_gym.sessions.worker import OWNER_KEY

SECRET = "token-test-" + "s" * 32


@given(session_id=st.text(), owner=st.none() | st.text(), replica=st.none() | st.dictionaries(st.sampled_from(["nemo_gym_replica", "nemo_gym_forward_port"]), st.text() | st.integers()))
def test_a_minted_token_reads_back_as_its_session_owner_and_replica(session_id, owner, replica):
    serializer = token_serializer(SECRET)
    payload = read_token(serializer, mint_token(serializer, session_id, owner, replica))
    expected = {SESSION_ID_KEY: session_id}
    if owner is not None:
        expected = {**expected, OWNER_KEY: owner, **(replica or {})}
    assert payload == expected


def test_without_an_owner_a_token_names_no_replica():
    serializer = token_serializer(SECRET)
    assert read_token(serializer, mint_token(serializer, "s1", None, {"nemo_gym_replica": "h:1"})) == {SESSION_ID_KEY: "s1"}


def test_a_token_of_another_secret_or_altered_is_no_session():
    token = mint_token(token_serializer(SECRET), "s1", "0123456789abcdef")
    assert read_token(token_serializer("other-" + "s" * 32), token) is None
    altered = token[:-1] + ("A" if token[-1] != "A" else "B")
    assert read_token(token_serializer(SECRET), altered) is None
    assert read_token(token_serializer(SECRET), "") is None


@pytest.mark.parametrize("payload", [["s1"], {"session": "s1"}, {SESSION_ID_KEY: 1}, "s1", None])
def test_a_signed_payload_that_is_not_a_session_is_no_session(payload):
    serializer = token_serializer(SECRET)
    assert read_token(serializer, serializer.dumps(payload)) is None


def test_the_session_of_a_request_is_its_first_token_headers():
    serializer = token_serializer(SECRET)
    first, second = mint_token(serializer, "s1", None), mint_token(serializer, "s2", None)
    scope = {"headers": [(b"cookie", b"x=1"), (TOKEN_HEADER_KEY, first.encode()), (TOKEN_HEADER_KEY, second.encode())]}
    assert token_session_id(scope, serializer) == "s1"
    assert token_session_id({"headers": [(b"cookie", b"x=1")]}, serializer) is None
    assert token_session_id({"headers": [(TOKEN_HEADER_KEY, b"forged")]}, serializer) is None


@pytest.mark.parametrize("path, mcp", [("/mcp", True), ("/mcp/", True), ("/mcp/tools", True), ("/mcpx", False), ("/v1/mcp", False), ("/", False)])
def test_the_mcp_path_is_mcp_and_what_is_under_it(path, mcp):
    assert is_mcp_path(path) is mcp
