"""What signs a server's sessions, as the server reads it (``sessions.signing``): its instance's secret and key,
its tokens, its cookie's name, and the session layer's settings, which the router reads the cookie with too."""

from __future__ import annotations

import pytest

from nemo_gym import SESSION_ID_KEY
from nemo_gym.sessions.cookie import SessionCookie
from nemo_gym.sessions.secret import instance_key
from nemo_gym.sessions.token import mint_token, read_token
from tests.unit_tests.routing_workers import EchoServer, instances

SECRET = "s" * 40
WORKER = "0123456789abcdef"


def server(name: str, **settings) -> EchoServer:
    return EchoServer.for_instance(name, instances(name, 1, **settings))


@pytest.fixture(autouse=True)
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("NEMO_GYM_STATE_DIR", str(tmp_path))
    return tmp_path


def test_a_configured_secret_signs_under_the_key_derived_for_the_instance_and_the_cookie_is_named_for_it():
    made = server("alpha", session_secret=SECRET)
    assert (made.secret, made.signing_key, made.session_cookie) == (SECRET, instance_key(SECRET, "alpha"), "alpha_session")
    assert made.session_options == {"secret_key": made.signing_key, "session_cookie": "alpha_session"}


def test_the_session_layer_built_with_the_servers_options_reads_the_tokens_and_cookies_it_signs_and_another_instances_do_not():
    alpha, beta = server("alpha", session_secret=SECRET), server("beta", session_secret=SECRET)
    session = {SESSION_ID_KEY: "s", "nemo_gym_worker": WORKER}
    cookie = SessionCookie(None, **alpha.session_options).signed(session)
    token = mint_token(alpha.tokens, "s", WORKER)
    assert (SessionCookie(None, **alpha.session_options).load(cookie), read_token(alpha.tokens, token)) == (session, session)
    assert (SessionCookie(None, **beta.session_options).load(cookie), read_token(beta.tokens, token)) == (None, None)


def test_an_unnamed_server_without_a_configured_secret_signs_with_one_of_its_own_and_keeps_no_file(state):
    first, second = server(""), server("")
    assert first.secret == first.secret and first.secret != second.secret
    assert list(state.iterdir()) == []


def test_a_named_server_without_a_configured_secret_keeps_the_instances_secret_across_servers(state):
    assert server("gamma").secret == server("gamma").secret
    assert (state / "secrets" / "gamma").exists()
