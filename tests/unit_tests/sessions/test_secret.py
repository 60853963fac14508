"""The signing secret: made once per instance, atomically; an empty, short or unreadable one is refused; an instance
signs with a key of its own, derived from the secret and its name."""

from __future__ import annotations

import multiprocessing
import os

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from itsdangerous import URLSafeSerializer

from nemo_gym import SESSION_ID_KEY
from nemo_gym import config as gym_config
from nemo_gym.config import ConfigError
from nemo_gym.process import discovery
from nemo_gym.process.launcher import LaunchError, Launcher
from nemo_gym.sessions.cookie import SessionCookie
from nemo_gym.sessions.secret import MIN_SECRET_BYTES, SecretError, instance_key, session_secret
from nemo_gym.sessions.token import mint_token, read_token, token_serializer

RACERS = 12
RACES = 10


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("NEMO_GYM_STATE_DIR", str(tmp_path))
    return tmp_path


def test_a_new_instance_gets_a_0600_secret_kept_across_calls(state):
    secret = session_secret("fresh")
    path = state / "secrets" / "fresh"
    assert len(secret.encode()) >= MIN_SECRET_BYTES
    assert path.read_text() == secret
    assert path.stat().st_mode & 0o777 == 0o600
    assert session_secret("fresh") == secret
    assert [entry.name for entry in path.parent.iterdir()] == ["fresh"]


@pytest.mark.parametrize("contents", ["", "\n", "too-short-a-secret"])
def test_an_empty_or_short_secret_file_is_an_error_naming_the_file(state, contents):
    path = state / "secrets" / "blank"
    path.parent.mkdir()
    path.write_text(contents)
    path.chmod(0o600)
    with pytest.raises(SecretError, match=f"the session secret file {path} is {len(contents.strip())} bytes long"):
        session_secret("blank")
    assert path.read_text() == contents


def test_an_unreadable_secret_file_is_an_error_naming_the_file(state):
    path = state / "secrets" / "unreadable"
    path.mkdir(parents=True)
    with pytest.raises(SecretError, match=f"cannot read the session secret file {path}"):
        session_secret("unreadable")


def test_a_configured_secret_shorter_than_32_bytes_is_an_error():
    with pytest.raises(SecretError, match="the configured session_secret is 31 bytes long"):
        session_secret("configured", "x" * 31)
    assert session_secret("configured", "x" * 32) == "x" * 32


def test_a_configured_secret_shorter_than_32_bytes_is_a_config_error_naming_the_key(tmp_path):
    path = tmp_path / "short.yaml"
    path.write_text("counter:\n  resources_servers:\n    example_session_state_mgmt:\n      session_secret: hunter2\n")
    with pytest.raises(ConfigError, match=r"short.yaml: counter\.resources_servers\.example_session_state_mgmt\.session_secret: .*7 bytes long"):
        discovery.load([path])


def race(state_dir: str, barrier, results) -> None:
    os.environ["NEMO_GYM_STATE_DIR"] = state_dir
    barrier.wait()
    try:
        results.put(session_secret("raced"))
    except Exception as error:  # noqa: BLE001 - the racer reports whatever went wrong
        results.put(repr(error))


def test_processes_that_make_the_secret_at_once_all_read_the_same_whole_secret(tmp_path):
    context = multiprocessing.get_context("fork")
    for attempt in range(RACES):
        state_dir = tmp_path / str(attempt)
        barrier, results = context.Barrier(RACERS), context.Queue()
        racers = [context.Process(target=race, args=(str(state_dir), barrier, results)) for _ in range(RACERS)]
        for racer in racers:
            racer.start()
        secrets = [results.get(timeout=60) for _ in racers]
        for racer in racers:
            racer.join(timeout=60)
        assert len(set(secrets)) == 1, secrets
        assert secrets[0] == (state_dir / "secrets" / "raced").read_text()
        assert len(secrets[0].encode()) >= MIN_SECRET_BYTES
        assert [entry.name for entry in (state_dir / "secrets").iterdir()] == ["raced"]


def test_a_server_with_a_blank_secret_file_refuses_to_start_naming_the_file(tmp_path):
    path = tmp_path / "secrets" / "counter"
    path.parent.mkdir()
    path.write_text("")
    path.chmod(0o600)
    instances = gym_config.parse({"counter": {"resources_servers": {"example_session_state_mgmt": {}}}})
    launcher = Launcher(instances, gym_config.free_port(), {"NEMO_GYM_STATE_DIR": str(tmp_path)})
    with pytest.raises(LaunchError) as error:
        launcher.start(timeout=60)
    assert f"server 'counter' cannot start: the session secret file {path} is 0 bytes long" in str(error.value)
    assert path.read_text() == ""


def world_writable_directory(path):
    path.parent.chmod(0o777)
    return path.parent


def directory_of_another_user(path):
    os.chown(path.parent, 12345, 12345)
    return path.parent


def secret_mode(mode):
    def change(path):
        path.chmod(mode)
        return path

    return change


def secret_of_another_user(path):
    os.chown(path, 12345, 12345)
    return path


@pytest.mark.parametrize(
    "plant, problem",
    [
        (world_writable_directory, "can be written by other users (mode 0777)"),
        (directory_of_another_user, "is owned by uid 12345, not by this server's user"),
        (secret_mode(0o666), "can be read or written by other users (mode 0666)"),
        (secret_mode(0o644), "can be read or written by other users (mode 0644)"),
        (secret_of_another_user, "is owned by uid 12345, not by this server's user"),
    ],
    ids=["world-writable secrets directory", "secrets directory of another user", "0666 secret", "0644 secret", "secret of another user"],
)
def test_a_secret_file_or_directory_others_own_or_can_reach_is_refused_at_start_naming_it(tmp_path, plant, problem):
    if os.geteuid() != 0:
        pytest.skip("planting files of another user needs root")
    path = tmp_path / "secrets" / "counter"
    path.parent.mkdir(mode=0o700)
    path.write_text("a-planted-secret-that-is-long-enough-to-sign-with")
    path.chmod(0o600)
    planted = plant(path)
    instances = gym_config.parse({"counter": {"resources_servers": {"example_session_state_mgmt": {}}}})
    launcher = Launcher(instances, gym_config.free_port(), {"NEMO_GYM_STATE_DIR": str(tmp_path)})
    try:
        with pytest.raises(LaunchError) as error:
            launcher.start(timeout=300)
    finally:
        launcher.stop()  # a start that was not refused leaves no server behind
    assert f"server 'counter' cannot start: the session secret {'directory' if planted == path.parent else 'file'} {planted} {problem}" in str(error.value)


def test_a_new_secret_is_refused_in_a_directory_others_can_write(state):
    (state / "secrets").mkdir(mode=0o700)
    (state / "secrets").chmod(0o733)
    with pytest.raises(SecretError, match=f"the session secret directory {state / 'secrets'} can be written by other users"):
        session_secret("fresh")
    assert list((state / "secrets").iterdir()) == []


def layers(secret: str, name: str) -> tuple[SessionCookie, URLSafeSerializer]:
    """The cookie layer and token serializer of instance ``name``, as its server builds them."""
    key = instance_key(secret, name)
    return SessionCookie(None, secret_key=key, session_cookie=f"{name}_session"), token_serializer(key)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=12), st.text(max_size=12), st.text(min_size=32, max_size=40))
def test_instances_that_share_a_secret_value_never_read_each_others_cookies_or_tokens(x, y, secret):
    assume(x != y)
    (x_cookies, x_tokens), (y_cookies, y_tokens) = layers(secret, x), layers(secret, y)
    session = {SESSION_ID_KEY: "s", "nemo_gym_worker": "0123456789abcdef"}
    cookie, token = x_cookies.signed(session), mint_token(x_tokens, "s", "0123456789abcdef")
    assert (x_cookies.load(cookie), read_token(x_tokens, token)) == (session, session)
    assert (y_cookies.load(cookie), read_token(y_tokens, token)) == (None, None)
