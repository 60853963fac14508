"""The process of one server instance: ``python -m nemo_gym.process.run`` with the launcher's environment.

One worker: uvicorn serves the server's app in this process. Several: uvicorn's own supervisor
starts the workers, each calling ``worker_app`` to build its app; this process serves no requests.
The workers are forked from this process, not spawned as fresh interpreters: each starts with the
libraries this process imported to check the config (nemo_gym, openai, fastapi: most of a start-up's
CPU) and runs only the server's own modules again, as a spawned worker would, in its worker environment.
A server module that registers something in a library's global registry at import therefore does so in
this process and again in each worker.
A server module needs no module-level ``app``: the app is built from the server class it defines,
or taken from the ``app`` that upstream's ``is_nemo_gym_fastapi_entrypoint(__file__)`` guard made.
As upstream, every process imports it with the server's own directory first on ``sys.path``.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import signal
import sys
from pathlib import Path
from typing import Any

import uvicorn
import uvicorn._subprocess
import uvicorn.supervisors.multiprocess
from starlette.types import ASGIApp
from uvicorn.importer import import_from_string
from uvicorn.supervisors.multiprocess import SIGNALS

from nemo_gym import config as gym_config
from nemo_gym.config.paths import import_server_module, server_module_checked
from nemo_gym.config_types import BaseRunServerInstanceConfig
from nemo_gym.durable.store import StoreError, open_store
from nemo_gym.env import (
    CONFIG_PATH_ENV,
    ENTRYPOINT_ENV,
    FORWARD_PORT_ENV,
    INSTANCE_ENV,
    NUM_WORKERS_ENV,
    SERVER_PROCESS_MODULE,
    SOCKET_DIR_ENV,
    WORKER_ENV,
    WORKER_LOG_DIR_ENV,
)
from nemo_gym.metrics.exposition import MULTIPROC_DIR_ENV, make_metrics_dir, remove_metrics_dir
from nemo_gym.process.public_server import PublicServer
from nemo_gym.protocols.handing_off import HandingOffProtocol
from nemo_gym.protocols.input_limits import InputLimits, LimitedHttpToolsProtocol
from nemo_gym.process.discovery import find_server_class
from nemo_gym.process.parent import die_with_parent, follow_parent
from nemo_gym.routing.replica import ReplicaAddressError, advertised_host
from nemo_gym.routing.transport.replica_port import claim_forward_port
from nemo_gym.routing.transport.unix import make_socket_dir, remove_socket_dir
from nemo_gym.server import SimpleServer
from nemo_gym.sessions.secret import SecretError, session_secret

KEEP_ALIVE_SECONDS = 75
# How long uvicorn's supervisor waits for a worker to answer its health ping. A worker replacing a dead one
# must start within this; 8 workers importing at once on 2 busy cores can take longer than uvicorn's 5 s
# default, which would kill and restart them in a loop. The supervisor pings each worker every 0.5 s and
# sees a death at its next round, unless the worker dies during a ping: then only after this long.
WORKER_HEALTHCHECK_SECONDS = 30
# What each worker of a multi-worker server calls to build its app.
WORKER_APP = f"{SERVER_PROCESS_MODULE}:worker_app"


def this_instance() -> gym_config.Instance:
    name = os.environ[INSTANCE_ENV]
    with open(os.environ[CONFIG_PATH_ENV]) as file:
        return gym_config.parse(json.load(file), check_ports=False)[name]


def worker_log_path(log_dir: str, instance: str, pid: int) -> str:
    return os.path.join(log_dir, f"{instance}.worker-{pid}.log")


def write_own_log() -> None:
    """In a worker of a multi-worker server started by the launcher: this process's output goes to a log
    of its own from now on, so that a worker that does not come up can be shown with its own last lines."""
    log_dir = os.environ.get(WORKER_LOG_DIR_ENV)
    if not log_dir or os.environ.get(WORKER_ENV) != "1":
        return
    sys.stdout.flush()
    sys.stderr.flush()
    log = os.open(worker_log_path(log_dir, os.environ[INSTANCE_ENV], os.getpid()), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)


def worker_app() -> ASGIApp:
    """The app of one worker: the module's own ``app`` if importing it made one, else built from its server class."""
    write_own_log()
    module = import_server_module(this_instance().module)
    app = getattr(module, "app", None)
    if app is not None:
        return app
    return find_server_class(module).from_environment().build_app()


def check_store(server_class: type[SimpleServer], config: BaseRunServerInstanceConfig, name: str) -> None:
    """A durable server's store opens here before any worker starts; else each worker would fail on it
    in turn, and uvicorn would start them again, until the launcher ran out of time."""
    if server_class.is_routed(config) and config.durable_sessions and server_class.session_states is not SimpleServer.session_states:
        open_store(config.session_store, name).close()


def uvicorn_options(instance: gym_config.Instance, config: BaseRunServerInstanceConfig, hand_off: bool = False) -> dict[str, Any]:
    """How uvicorn serves an instance, whatever its number of workers. ``hand_off``: its workers hand connections to
    each other (``protocols.handing_off``): routed, of several workers, with ``hand_off`` set."""
    return dict(
        host=instance.host,
        port=instance.port,
        log_level="warning",
        access_log=False,
        lifespan="on",  # an app that cannot start makes the process exit, not serve 500s
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        timeout_graceful_shutdown=5,
        timeout_worker_healthcheck=WORKER_HEALTHCHECK_SECONDS,
        http=InputLimits.of(config).protocol(HandingOffProtocol if hand_off else LimitedHttpToolsProtocol),
    )


def fork_workers() -> None:
    """Make uvicorn fork its workers from this process. A forked worker gets back the signal handlers this
    process had before uvicorn's supervisor set its own (a spawned one starts with the defaults), and this
    process's objects are frozen out of the collector, so that a worker's collections neither walk nor
    copy them. A worker dies with this process. Each worker's server is a ``PublicServer``, which the worker's
    hand-off socket serves its siblings' connections with."""
    handlers = {sig: handler for sig in SIGNALS if (handler := signal.getsignal(sig)) is not None}

    def in_worker() -> None:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        # A worker whose server process is gone (killed) has no one to stop it: it goes too.
        die_with_parent(signal.SIGKILL)

    os.register_at_fork(after_in_child=in_worker)
    uvicorn._subprocess.spawn = multiprocessing.get_context("fork")
    uvicorn.supervisors.multiprocess.Server = PublicServer
    gc.freeze()


def serve(server_class: type[SimpleServer] | None = None, app_factory: str | None = None) -> None:
    """Serve the instance the environment names, with as many workers as its config asks for.

    ``app_factory`` ("module:function") builds each worker's app; by default ``worker_app``, from the
    instance's own module (the benchmark serves a server of its own, outside the server directories).
    The instance's workers keep their metrics in a directory of its own, new at start (whatever
    ``PROMETHEUS_MULTIPROC_DIR`` this process inherited) and removed at stop (``nemo_gym.metrics.exposition``).
    """
    metrics_dir = os.environ[MULTIPROC_DIR_ENV] = make_metrics_dir()
    try:
        serve_instance(server_class, app_factory)
    finally:
        remove_metrics_dir(metrics_dir)


def serve_instance(server_class: type[SimpleServer] | None, app_factory: str | None) -> None:
    instance = this_instance()
    if server_class is None and instance.num_workers > 1:
        # Forgotten once found, so that each forked worker imports the server's modules in its own environment.
        with server_module_checked(instance.module, forget_package=True) as module:
            server_class = find_server_class(module)
    elif server_class is None:
        server_class = find_server_class(import_server_module(instance.module))
    try:
        session_secret(instance.name, instance.settings.get("session_secret"))
    except SecretError as error:
        sys.exit(f"server {instance.name!r} cannot start: {error}")
    config = server_class.validate_config(instance.name, instance.settings)
    try:
        check_store(server_class, config, instance.name)
    except StoreError as error:
        sys.exit(f"server {instance.name!r} cannot start: {error}")
    hand_off = config.hand_off and instance.num_workers > 1 and server_class.is_routed(config)
    options = uvicorn_options(instance, config, hand_off)
    if server_class.is_replica(config):
        # Held (bound, never listening) until this process ends; its workers listen on it.
        forward_port = claim_replica_port(config, instance.name)
        os.environ[FORWARD_PORT_ENV] = str(forward_port.getsockname()[1])
    if instance.num_workers == 1:
        uvicorn.run(import_from_string(app_factory)() if app_factory else worker_app(), **options)
        return
    # Set only now, so that this process's own import of the module built no app.
    os.environ.update(
        {
            WORKER_ENV: "1",
            ENTRYPOINT_ENV: str(Path(instance.server_type, instance.implementation, instance.settings["entrypoint"])),
            NUM_WORKERS_ENV: str(instance.num_workers),
        }
    )
    app_factory = app_factory or WORKER_APP
    options.update(workers=instance.num_workers, factory=True)
    fork_workers()
    # Every routed worker serves a private socket in this directory; it goes when the server stops. A
    # launcher may hand one over, so that it can remove it even if this process is killed.
    if not server_class.is_routed(config) or os.environ.get(SOCKET_DIR_ENV):
        uvicorn.run(app_factory, **options)
        return
    os.environ[SOCKET_DIR_ENV] = socket_dir = make_socket_dir()
    try:
        uvicorn.run(app_factory, **options)
    finally:
        remove_socket_dir(socket_dir)


def claim_replica_port(config: BaseRunServerInstanceConfig, name: str):
    """The replica's forwarding port (``forward_port``, or a free one), held for the server's life."""
    try:
        advertised_host(config.host, config.advertise_host)
        return claim_forward_port(config.host, config.forward_port or 0)
    except ReplicaAddressError as error:
        sys.exit(f"server {name!r} cannot start as a replica: {error}")
    except OSError as error:
        sys.exit(f"server {name!r} cannot hold its forwarding port {config.forward_port or 0} on {config.host}: {error}")


if __name__ == "__main__":
    follow_parent()
    serve()
