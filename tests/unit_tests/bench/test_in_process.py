"""scripts/bench/in_process.py: its routed app serves every episode's requests as direct hits, and its two builds differ only in routing."""

from __future__ import annotations

import asyncio
import tempfile
from unittest import mock

from nemo_gym.routing.forwarder import Forwarder
from nemo_gym.routing.router import SessionRouter
from nemo_gym.sessions.worker import OWNER_KEY
from scripts.bench import in_process


async def play(routed: bool) -> tuple[object, list[dict | None]]:
    """Three episodes through the build; the app's router (None when off) and each episode's last session."""
    with tempfile.TemporaryDirectory(prefix="ngw-test-", dir="/tmp") as socket_dir:
        app = in_process.build(routed, socket_dir)
        inner = app.app.app  # inside the metrics endpoint and the body limit
        router = inner if isinstance(inner, SessionRouter) else None
        sessions = []
        async with in_process.lifespan(app):
            for _ in range(3):
                cookie = None
                for path, body in in_process.BODIES:
                    cookie = await in_process.request(app, path, body, cookie)
                reader = router.owners.session_layer if router else None
                sessions.append(reader.read([(b"cookie", cookie.encode())]) if reader else None)
        return router, sessions


def test_the_routed_build_serves_every_request_here_and_its_sessions_name_this_worker():
    refuse = mock.AsyncMock(side_effect=AssertionError("forwarded"))
    with mock.patch("nemo_gym.routing.forwarder.Forwarder.forward", refuse), mock.patch("nemo_gym.routing.forwarder.Forwarder.deliver", refuse):
        router, sessions = asyncio.run(play(routed=True))
    assert router is not None
    assert [session[OWNER_KEY] for session in sessions] == [router.worker_id] * 3


def test_the_unrouted_build_has_no_router():
    router, _ = asyncio.run(play(routed=False))
    assert router is None


def test_each_forwarded_row_sends_every_request_after_the_seed_over_its_hop():
    hops: list[str] = []
    forward = Forwarder.forward

    async def counted(self, *args, **kwargs):
        hops.append(self.hop)
        return await forward(self, *args, **kwargs)

    async def run() -> dict[str, list[str]]:
        seen = {}
        async with in_process.rows() as pairs:
            for name in ("forwarded to a sibling", "forwarded across replicas", "routed, direct hits"):
                hops.clear()
                await in_process.episodes(pairs[name], 2)
                seen[name] = list(hops)
        return seen

    with mock.patch.object(Forwarder, "forward", counted):
        seen = asyncio.run(run())
    after_the_seed = 2 * (len(in_process.BODIES) - 1)
    assert seen == {"forwarded to a sibling": ["worker"] * after_the_seed, "forwarded across replicas": ["replica"] * after_the_seed, "routed, direct hits": []}



def test_files_lists_per_row_what_a_request_after_the_seed_crosses_and_one_cookie_check(capsys):
    async def run() -> None:
        async with in_process.rows() as pairs:
            await in_process.crossed(pairs, 2)

    asyncio.run(run())
    rows: dict[str, list[str]] = {}
    for line in capsys.readouterr().out.splitlines():
        if line.startswith("    "):
            rows[name].append(line.strip())
        else:
            name, figures = line.split(": ", 1)
            rows[name] = []
            assert figures.endswith(" files, 1 cookie signature checks per request"), line
    assert "nemo_gym/routing/transport/unix.py" in rows["forwarded to a sibling"]
    assert "nemo_gym/routing/transport/tcp.py" in rows["forwarded across replicas"]
    assert not any("/transport/" in file for file in rows["routed, direct hits"] + rows["routing off"])
    assert "nemo_gym/routing/router.py" not in rows["routing off"]
    assert not any(file.startswith("scripts/") for files in rows.values() for file in files)
