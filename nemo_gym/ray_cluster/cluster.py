"""This process's connection to the one Ray cluster of a ``gym env start``.

``join(address)`` makes this process a driver of the cluster at ``address`` (a GCS address
``host:port``, as upstream's ``ray_head_node_address``), or, given none, starts a local cluster
(one node, its processes children of this process that die with it) and returns its address, which
the launcher hands to every server process it starts: they join it, none starts one of its own.
``leave()`` disconnects (and stops the local cluster, if this process started it). Nothing here runs
``ray stop``, which kills Ray's processes by name across the whole machine.

A local cluster's start waits a fixed 30 s (Ray's own, not a setting) for its node to register with
its GCS; on a loaded machine its raylet may not make it (seen at load average 22 to 27 on 2 cores). Such
a start is tried again, ``LOCAL_START_ATTEMPTS`` times in all, once every process the failed one left
(this process's own children, by PID) is gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from types import ModuleType

from nemo_gym.process.parent import children
from nemo_gym.ray_cluster.need import RayMissing, is_ray_missing

LOCAL_START_ATTEMPTS = 2
# What Ray's exception says when its node did not register in time.
NODE_TIMED_OUT = "timed out during startup"

logger = logging.getLogger(__name__)


def ray_module(what: str) -> ModuleType:
    """``ray``, or ``RayMissing`` naming ``what`` needs it and the extra that installs it."""
    try:
        import ray
    except ImportError as error:
        if is_ray_missing(error):
            raise RayMissing(what) from None
        raise
    return ray


def join(address: str | None, what: str = "this process") -> tuple[str, bool]:
    """Connect to the cluster at ``address`` or, without one, start a local cluster: its GCS address, and
    whether it was started here. A process already connected stays on its cluster."""
    ray = ray_module(what)
    if ray.is_initialized():
        return ray.get_runtime_context().gcs_address, False
    if address:
        ray.init(address=address, ignore_reinit_error=True)
    else:
        start_local(ray)
    return ray.get_runtime_context().gcs_address, not address


def start_local(ray: ModuleType) -> None:
    """Start a local cluster and connect to it, tried again where its node did not register in time."""
    for attempt in range(1, LOCAL_START_ATTEMPTS + 1):
        before = children(os.getpid())
        try:
            ray.init(ignore_reinit_error=True)
            return
        except Exception as error:
            if NODE_TIMED_OUT not in str(error) or attempt == LOCAL_START_ATTEMPTS:
                raise
            left = children(os.getpid()) - before
            logger.warning("Ray's local cluster did not start (%s); its %d processes stopped, starting it again", error, len(left))
            end(left)


def end(pids: set[int]) -> None:
    """SIGKILL each of this process's children ``pids`` and wait for it."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def leave() -> None:
    """Disconnect this process from its cluster; a local cluster it started stops with it."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
