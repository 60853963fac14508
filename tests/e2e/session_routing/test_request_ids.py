"""Request ids end to end: a request sent again with its ``Idempotency-Key`` is applied once and gets its
original reply, on any worker, after its owner was SIGKILLed, after a restart and after export/restore, and
a verify sent again after it ended its session gets its reward again, not 410 (the counter at 4 workers with
its SQLite store; ``requests`` and ``httpx`` as the clients)."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from pathlib import Path

import httpx
import pytest
import requests

from nemo_gym.client.reading import cookie_header
from nemo_gym.process.launcher import Launcher
from scripts.bench.client import VERIFY_BODY
from tests.e2e.session_routing.test_durable_sessions import COUNTER, SECRET, counter_config, kill, launch, restored
from tests.session_cookies import cookie_owner

SESSIONS = 24
TIMEOUT_SECONDS = 60
RETRIES = 10


class Episode:
    """One session driven with ``requests``, a new connection per request; its increments by request id."""

    def __init__(self, url: str, start: int) -> None:
        self.url = url
        self.cookies: dict[str, str] = {}
        reply = self.post("/seed_session", {"initial_count": start})
        assert reply.status_code == 200, reply.text
        self.start = start
        self.replies: dict[str, tuple[int, bytes]] = {}

    def post(self, path: str, body: dict, key: str | None = None) -> requests.Response:
        """A 503 with Retry-After (an owner killed under the request, say) is sent again, as a client is told to."""
        headers = {"Idempotency-Key": key} if key is not None else {}
        for _ in range(RETRIES):
            reply = requests.post(f"{self.url}{path}", json=body, cookies=self.cookies, headers={**headers, "Connection": "close"}, timeout=TIMEOUT_SECONDS)
            self.cookies.update(reply.cookies.get_dict())
            if reply.status_code != 503 or "Retry-After" not in reply.headers:
                break
            time.sleep(float(reply.headers["Retry-After"]))
        return reply

    def increment(self, key: str) -> None:
        reply = self.post("/increment_counter", {"count": 1}, key)
        assert reply.status_code == 200 and "Idempotent-Replayed" not in reply.headers, (reply.status_code, reply.text)
        self.replies[key] = (reply.status_code, reply.content)

    def sent_again(self) -> list[tuple[int, bytes, str | None]]:
        """Every increment sent again, with its id and the cookie as the client holds it now."""
        sent = [self.post("/increment_counter", {"count": 1}, key) for key in self.replies]
        return [(reply.status_code, reply.content, reply.headers.get("Idempotent-Replayed")) for reply in sent]

    def count(self) -> int:
        reply = self.post("/get_counter_value", {})
        assert reply.status_code == 200, reply.text
        return reply.json()["count"]


def incremented(url: str) -> list[Episode]:
    """``SESSIONS`` episodes, each incremented twice under ids of its own."""
    episodes = [Episode(url, start * 10) for start in range(SESSIONS)]
    for episode in episodes:
        for _ in range(2):
            episode.increment(f"episode-{uuid.uuid4()}")
    return episodes


def applied_once_with_original_replies(episodes: list[Episode], url: str) -> None:
    """Each increment sent again (to ``url``: a restarted server listens on another port) got its original reply."""
    for episode in episodes:
        episode.url = url
        originals = [(status, body, "true") for status, body in episode.replies.values()]
        assert episode.sent_again() == originals
        assert episode.count() == episode.start + 2


@pytest.fixture(scope="module")
def counter(tmp_path_factory) -> Launcher:
    launcher = launch(counter_config(4), tmp_path_factory.mktemp("request_ids_state"))
    yield launcher
    launcher.stop()


def test_a_request_sent_again_with_its_id_gets_its_original_reply_and_is_applied_once(counter):
    url = counter.instances[COUNTER].url
    applied_once_with_original_replies(incremented(url), url)


def test_a_request_sent_again_with_its_id_after_its_owner_was_sigkilled_is_applied_once_by_the_adopter(counter):
    url = counter.instances[COUNTER].url
    episodes = incremented(url)
    victim, held = Counter(cookie_owner(episode.cookies, COUNTER, SECRET) for episode in episodes).most_common(1)[0]
    kill(counter, victim)
    applied_once_with_original_replies(episodes, url)
    assert held > 1 and victim not in {cookie_owner(episode.cookies, COUNTER, SECRET) for episode in episodes}


def verified(episodes: list[Episode]) -> dict[str, tuple[int, bytes]]:
    """Each episode's verify, under an id of its own, by its key: its reply (the reward)."""
    replies = {}
    for episode in episodes:
        key = f"verify-{uuid.uuid4()}"
        reply = episode.post("/verify", {**VERIFY_BODY, "expected_count": episode.start + 2}, key)
        assert reply.status_code == 200 and reply.json()["reward"] == 1.0, reply.text
        replies[key] = (reply.status_code, reply.content)
    return replies


def sent_again_after_the_end(episodes: list[Episode], replies: dict[str, tuple[int, bytes]]) -> None:
    """Each verify sent again with its id got its original reply, replayed; one without its id gets 410 (the session ended once)."""
    for episode, (key, original) in zip(episodes, replies.items()):
        reply = episode.post("/verify", {**VERIFY_BODY, "expected_count": episode.start + 2}, key)
        assert (reply.status_code, reply.content, reply.headers.get("Idempotent-Replayed")) == (*original, "true"), reply.text
        assert episode.post("/verify", {**VERIFY_BODY, "expected_count": episode.start + 2}).status_code == 410


def test_a_verify_sent_again_with_its_id_after_its_session_ended_gets_its_original_reward_not_410(counter):
    episodes = incremented(counter.instances[COUNTER].url)
    sent_again_after_the_end(episodes, verified(episodes))


def test_a_verify_sent_again_with_its_id_after_its_owner_was_sigkilled_gets_its_original_reward_not_410(counter):
    episodes = incremented(counter.instances[COUNTER].url)
    replies = verified(episodes)
    victim, held = Counter(cookie_owner(episode.cookies, COUNTER, SECRET) for episode in episodes).most_common(1)[0]
    kill(counter, victim)
    sent_again_after_the_end(episodes, replies)
    assert held > 1


def test_an_id_that_is_not_printable_ascii_or_is_too_long_gets_400_and_changes_nothing(counter):
    episode = Episode(counter.instances[COUNTER].url, 7)
    with httpx.Client(timeout=TIMEOUT_SECONDS) as client:
        for key in (b"with space", b"x" * 256, "caf\u00e9".encode("latin-1"), b""):
            headers = {"Idempotency-Key": key, "Cookie": cookie_header(episode.cookies)}  # no jar: a 400 may set the cookie again
            reply = client.post(f"{episode.url}/increment_counter", json={"count": 1}, headers=headers)
            assert reply.status_code == 400 and "Idempotency-Key" in reply.json()["detail"], (key, reply.text)
    assert episode.count() == 7


def test_a_request_sent_again_with_its_id_after_a_restart_and_after_export_and_restore_is_applied_once(tmp_path: Path):
    old_dir, fresh_dir, path = tmp_path / "old", tmp_path / "fresh", tmp_path / "sessions.json"
    launcher = launch(counter_config(4), old_dir)
    try:
        episodes = incremented(launcher.instances[COUNTER].url)
    finally:
        launcher.stop()
    launcher = launch(counter_config(4), old_dir)
    try:
        applied_once_with_original_replies(episodes, launcher.instances[COUNTER].url)
    finally:
        launcher.stop()
    with restored(old_dir, fresh_dir, path) as launcher:
        applied_once_with_original_replies(episodes, launcher.instances[COUNTER].url)
