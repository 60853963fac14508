"""The metrics a server process keeps, and the one holder of them (``METERS``) that the code where each thing happens counts on.

``prometheus_client`` decides at its import whether it keeps values in memory or in files of a multi-process
directory (``PROMETHEUS_MULTIPROC_DIR``, made per instance by ``nemo_gym.process.run``). So it is imported
only by ``install``, which a server calls once it builds its app in its worker, after that directory is set;
until then every meter is ``IDLE`` and counts nothing. Labelled meters are bound to their children once
(per hop, per status, per reason), so a request's counting is an attribute or dictionary lookup and an add.
"""

from __future__ import annotations

import os
from typing import Any

# Histogram buckets (seconds): a forward on one host takes a fraction of a millisecond plus the owner's
# handling; a store commit is an fsync or a PostgreSQL round trip.
FORWARD_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
# A forward goes to a sibling worker of this host, or to another replica of a replica set.
HOPS = ("worker", "replica")


class Idle:
    """A meter before ``install``: counts nothing."""

    def inc(self, amount: float = 1) -> None:
        pass

    def dec(self, amount: float = 1) -> None:
        pass

    def observe(self, amount: float) -> None:
        pass


IDLE = Idle()


class Meters:
    """Every metric of a server process (docs/metrics.md lists them); each attribute is a bound meter."""

    def __init__(self) -> None:
        self.registry: Any = None
        self.installed = False
        self.live_sessions: Any = IDLE
        self.sessions_started: Any = IDLE
        self.sessions_adopted: Any = IDLE
        self.served_here: Any = IDLE
        self.store_commit_seconds: Any = IDLE
        self.forwarded: dict[str, Any] = dict.fromkeys(HOPS, IDLE)
        self.forward_seconds: dict[str, Any] = dict.fromkeys(HOPS, IDLE)
        self.hand_offs_sent: Any = IDLE
        self.hand_offs_received: Any = IDLE
        self.relayed: Any = IDLE
        self.not_handed_off: dict[str, Any] = {}
        self.responses: dict[int, Any] = {}
        self.ended: dict[str, Any] = {}
        self._responses: Any = None
        self._ended: Any = None
        self._not_handed_off: Any = None
        self.worker = ""

    def install(self, worker: str | None, keeps_sessions: bool) -> None:
        """Make the metrics, in a registry of their own. ``worker`` labels this process's live sessions (its
        worker ID; the process ID when it has none); ``keeps_sessions``: false for a server that keeps no
        session state (a model server), whose sessions are counted as started but never as live."""
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        from prometheus_client.multiprocess import mark_process_dead

        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            # A process that had this PID before (gone, its PID reused) left no live sessions to this one.
            mark_process_dead(os.getpid())
        registry = self.registry = CollectorRegistry()
        live = Gauge(
            "nemo_gym_live_sessions", "Sessions this worker holds now.", ["worker"], registry=registry, multiprocess_mode="livesum"
        )
        self.live_sessions = live.labels(worker=worker or str(os.getpid())) if keeps_sessions else IDLE
        self.sessions_started = Counter("nemo_gym_sessions_started", "Sessions started (a session id minted).", registry=registry)
        self.sessions_adopted = Counter(
            "nemo_gym_sessions_adopted", "Sessions taken over from the store: a dead owner's, or restored ones.", registry=registry
        )
        self._ended = Counter("nemo_gym_sessions_ended", "Sessions ended, by reason.", ["reason"], registry=registry)
        self.ended = {}
        self.served_here = Counter(
            "nemo_gym_requests_served_here", "Requests from the public port that this worker's app served itself.", registry=registry
        )
        forwarded = Counter(
            "nemo_gym_requests_forwarded", "Requests forwarded to their owner, whose reply came back, by hop.", ["hop"], registry=registry
        )
        seconds = Histogram(
            "nemo_gym_forward_duration_seconds", "Forwards from the first try to the end of the reply, by hop.", ["hop"],
            registry=registry, buckets=FORWARD_BUCKETS,
        )
        self.forwarded = {hop: forwarded.labels(hop=hop) for hop in HOPS}
        self.forward_seconds = {hop: seconds.labels(hop=hop) for hop in HOPS}
        # Per worker, as the operator asks: which worker hands off, which takes, which forwards and why.
        self.worker = worker or str(os.getpid())
        sent = Counter("nemo_gym_hand_offs_sent", "Connections handed to the worker of this host that owns their session.", ["worker"], registry=registry)
        received = Counter("nemo_gym_hand_offs_received", "Connections a sibling worker handed to this one.", ["worker"], registry=registry)
        self.hand_offs_sent = sent.labels(worker=self.worker)
        self.hand_offs_received = received.labels(worker=self.worker)
        relayed = Counter(
            "nemo_gym_forwards_relayed", "Forwards to another replica relayed as bytes by the public port's protocol, never an ASGI request here.",
            ["worker"], registry=registry,
        )
        self.relayed = relayed.labels(worker=self.worker)
        self._not_handed_off = Counter(
            "nemo_gym_forwards_not_handed_off", "Requests forwarded to a worker of this host instead of handing it their connection, by reason.",
            ["worker", "reason"], registry=registry,
        )
        self.not_handed_off = {}
        self._responses = Counter("nemo_gym_responses", "Replies sent from the public port, by HTTP status.", ["status"], registry=registry)
        self.responses = {}
        self.store_commit_seconds = Histogram(
            "nemo_gym_store_commit_duration_seconds", "Group commits of durable sessions to the store.", registry=registry, buckets=COMMIT_BUCKETS
        )
        self.installed = True

    def response(self, status: int) -> Any:
        """The counter of replies with ``status``, bound on its first use."""
        meter = self.responses.get(status)
        if meter is None:
            meter = IDLE if self._responses is None else self._responses.labels(status=str(status))
            self.responses[status] = meter
        return meter

    def forwarded_not_handed_off(self, reason: str) -> Any:
        """The counter of forwards to a sibling that did not hand the connection off, for ``reason``, bound on its first use."""
        meter = self.not_handed_off.get(reason)
        if meter is None:
            meter = IDLE if self._not_handed_off is None else self._not_handed_off.labels(worker=self.worker, reason=reason)
            self.not_handed_off[reason] = meter
        return meter

    def session_ended(self, reason: str) -> None:
        """A session this worker held ended (``nemo_gym.lifecycle``), counted under ``reason``: one fewer live session here."""
        meter = self.ended.get(reason)
        if meter is None:
            meter = IDLE if self._ended is None else self._ended.labels(reason=reason)
            self.ended[reason] = meter
        meter.inc()
        self.live_sessions.dec()


METERS = Meters()


def session_ended(reason: str) -> None:
    """Count the end of a session (``verify``, ``close``, ``idle``, ...): called once per session, where it ends."""
    METERS.session_ended(reason)
