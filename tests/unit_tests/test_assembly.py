"""The ASGI layers a request crosses, read by walking a routed worker's built app: locally, forwarded to a
sibling on this host, and forwarded from another replica (its forwarding port), each process's part."""

from __future__ import annotations

import inspect
import tempfile

from starlette.applications import Starlette
from starlette.routing import Router

from nemo_gym.protocols.input_limits import InputLimits
from nemo_gym.routing.router import SessionRouter
from nemo_gym.routing.transport.private_server import PrivateServer
from nemo_gym.routing.transport.replica_port import BodyChecked
from scripts.bench import in_process


def layers(app: object, until: type | None = None) -> list[object]:
    """Each layer from ``app`` inward (a Starlette app's own middleware stack included), down to its router,
    or up to and including the first ``until``."""
    found = []
    while app is not None:
        app = app.__self__ if inspect.ismethod(app) else app  # a bound entrance: its object's layer
        found.append(app)
        if isinstance(app, Router) or (until is not None and isinstance(app, until)):
            break
        app = (app.middleware_stack or app.build_middleware_stack()) if isinstance(app, Starlette) else getattr(app, "app", None)
    return found


def names(chain: list[object]) -> list[str]:
    return [type(layer).__name__ for layer in chain if not isinstance(layer, Starlette)]


def entrance(app: object, guard=None, cancels: bool = True) -> object:
    """What a private listener serves ``app`` through (``guard``: the forwarding port's body check; ``cancels``: as the transport builds it)."""
    return PrivateServer(app, InputLimits(), guard=guard, cancels=cancels).server.config.app


def paths() -> dict[str, list[str]]:
    with tempfile.TemporaryDirectory(prefix="ngw-test-", dir="/tmp") as socket_dir:
        public = layers(in_process.build(True, socket_dir))
    router = next(layer for layer in public if isinstance(layer, SessionRouter))
    app = next(layer for layer in public if isinstance(layer, Starlette))
    to_router = public[: public.index(router) + 1]
    owner = layers(entrance(app))
    return {
        "local": names(public),
        "forwarded": names(to_router) + names(owner),
        "cross-host, served by the replica's worker that takes it": names(to_router) + names(layers(entrance(router.from_replica, BodyChecked, cancels=False))),
        "cross-host, sent on to its owner there": names(to_router) + names(layers(entrance(router.from_replica, BodyChecked, cancels=False), SessionRouter)) + names(owner),
    }


def test_every_path_crosses_the_apps_session_layer_once_and_a_router_once_per_host():
    routers = {path: chain.count("SessionRouter") for path, chain in paths().items()}
    assert all(chain.count("SessionCookie") == 1 for chain in paths().values())
    assert routers == {"local": 1, "forwarded": 1, "cross-host, served by the replica's worker that takes it": 2, "cross-host, sent on to its owner there": 2}


def test_every_path_is_cancelled_on_disconnect_by_one_layer_in_each_process_that_serves_it():
    assert {path: chain.count("CancelOnDisconnect") for path, chain in paths().items()} == {path: 1 for path in paths()}


def test_a_forward_enters_its_owner_past_the_router_and_the_body_limit():
    chain = paths()["forwarded"]
    after = chain[chain.index("SessionRouter") + 1 :]
    assert after[0] == "PrivateEntrance" and "SessionRouter" not in after and "BodyLimit" not in after
