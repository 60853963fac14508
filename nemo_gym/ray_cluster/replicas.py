"""An instance's replicas on a Ray cluster: ``num_replicas: N`` runs N replicas of it, one per node.

A placement group of N bundles with the ``STRICT_SPREAD`` strategy reserves one node per replica (the
start fails, naming the nodes alive, when the cluster has fewer). On each a ``ReplicaNode`` actor,
pinned to its bundle, starts the replica's keeper (``nemo_gym.ray_cluster.keeper``): a launcher of
that one instance on that node, with the node's address as ``host`` and ``advertise_host``, its
``num_workers``, one ``session_secret`` for the set (the configured one, or one made for this start)
and ``replicas`` listing every replica's URL: one replica set (docs/replicas.md). The
instance's settings in the config every other server gets name the first replica as ``host`` and
all in ``replicas``, so Gym's client spreads new sessions over them.

Stopping: ``stop()`` asks each keeper to stop its server (SIGTERM, then its group SIGKILLed), then
kills the actors and removes the placement group. Each keeper also dies with its actor (SIGTERM by
``PR_SET_PDEATHSIG``, then it stops its server the same way), and the actors with this process's
connection to the cluster (Ray ends the actors a dead driver owns), so a launcher SIGKILLed leaves
nothing behind on any node either.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from nemo_gym.config import Instance, merge
from nemo_gym.env import PARENT_PID_ENV
from nemo_gym.routing.replica import replica_address

# A replica's reservation: a sliver of one CPU, so that replicas take no CPU from the cluster's tasks.
BUNDLE = {"CPU": 0.01}
PLACEMENT_TIMEOUT_SECONDS = 60
# How long each replica's keeper has to stop its server before it is killed.
KEEPER_STOP_SECONDS = 25
KEEPER_MODULE = "nemo_gym.ray_cluster.keeper"
READY = "ready"
LOG_TAIL_CHARACTERS = 4000


class PlacementError(RuntimeError):
    """The replicas could not be placed or started; the message says why (the launcher's LaunchError)."""


class ReplicaNode:
    """On one node: the keeper of one replica. A Ray actor (``ray.remote`` is applied when it is placed)."""

    def __init__(self) -> None:
        self.keeper: subprocess.Popen | None = None
        self.run_dir = Path(tempfile.mkdtemp(prefix="nemo_gym_replica_"))

    def node_address(self) -> str:
        import ray

        return ray.util.get_node_ip_address()

    def start(self, config: dict, name: str, env: dict[str, str], timeout: float) -> None:
        """Start the keeper of replica ``name`` of ``config`` and wait until it says its server serves."""
        config_path = self.run_dir / "config.json"
        config_path.write_text(json.dumps(config))
        log_path = self.run_dir / "keeper.log"
        with open(log_path, "wb") as log:
            self.keeper = subprocess.Popen(
                [sys.executable, "-m", KEEPER_MODULE, str(config_path), name, str(timeout)],
                env={**os.environ, **env, PARENT_PID_ENV: str(os.getpid()), "PYTHONUNBUFFERED": "1"},
                stdout=subprocess.PIPE, stderr=log, start_new_session=True, text=True,
            )
        line = self.keeper.stdout.readline()
        if line.strip() != READY:
            self.keeper.wait()
            raise RuntimeError(f"replica {name} on {self.node_address()} did not start:\n{log_path.read_text(errors='replace')[-LOG_TAIL_CHARACTERS:]}")

    def stop(self) -> None:
        if self.keeper is not None and self.keeper.poll() is None:
            self.keeper.send_signal(signal.SIGTERM)
            try:
                self.keeper.wait(timeout=KEEPER_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                os.killpg(self.keeper.pid, signal.SIGKILL)
                self.keeper.wait()
        shutil.rmtree(self.run_dir, ignore_errors=True)


class ReplicaSet:
    """The replicas of one instance on the cluster this process is connected to."""

    def __init__(self, instance: Instance, env: dict[str, str]) -> None:
        self.instance = instance
        self.env = env
        self.urls: list[str] = []
        self.actors: list[Any] = []
        self.group = None

    def start(self, config: dict, timeout: float) -> None:
        """Place the replicas, start each with its settings, and name them in the instance's settings."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        instance, count = self.instance, self.instance.num_replicas
        too_few = f"{instance.name}: num_replicas {count} needs {count} nodes of the Ray cluster, one per replica; it has {{alive}} alive"
        if (alive := sum(node["Alive"] for node in ray.nodes())) < count:
            raise PlacementError(too_few.format(alive=alive))
        self.group = placement_group([dict(BUNDLE)] * count, strategy="STRICT_SPREAD")
        try:
            ray.get(self.group.ready(), timeout=PLACEMENT_TIMEOUT_SECONDS)
        except ray.exceptions.GetTimeoutError:
            raise PlacementError(too_few.format(alive=sum(node["Alive"] for node in ray.nodes()))) from None
        actor_class = ray.remote(ReplicaNode)
        runtime_env = {"env_vars": {"PYTHONPATH": self.env["PYTHONPATH"]}} if self.env.get("PYTHONPATH") else None
        for index in range(count):
            strategy = PlacementGroupSchedulingStrategy(placement_group=self.group, placement_group_bundle_index=index)
            self.actors.append(actor_class.options(num_cpus=BUNDLE["CPU"], scheduling_strategy=strategy, runtime_env=runtime_env).remote())
        hosts = ray.get([actor.node_address.remote() for actor in self.actors], timeout=timeout)
        port = instance.port
        self.urls = [f"http://{replica_address(host, port)}" for host in hosts]
        secret = instance.settings.get("session_secret") or secrets.token_urlsafe(32)
        shared = {"session_secret": secret, "replicas": self.urls}
        instance.settings.update(shared, host=hosts[0])
        starts = []
        for actor, host in zip(self.actors, hosts):
            own = merge(config, {instance.name: {instance.server_type: {instance.implementation: {**instance.settings, **shared, "host": host, "advertise_host": host, "num_replicas": 1}}}})
            starts.append(actor.start.remote(own, instance.name, self.env, timeout))
        try:
            ray.get(starts, timeout=timeout + PLACEMENT_TIMEOUT_SECONDS)
        except ray.exceptions.RayError as error:
            raise PlacementError(f"{instance.name}: its replicas did not all start: {error}") from None

    def stop(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        if self.actors:
            ray.wait([actor.stop.remote() for actor in self.actors], num_returns=len(self.actors), timeout=KEEPER_STOP_SECONDS + 5)
            for actor in self.actors:
                ray.kill(actor)
            self.actors.clear()
        if self.group is not None:
            remove_placement_group(self.group)
            self.group = None
