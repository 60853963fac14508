"""W3C trace context across a forward: the owner's handler sees the trace the caller sent, and, with a tracer
provider, each hop is a span of it."""

from __future__ import annotations

import sys

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from nemo_gym.routing.hop_tracing import HopTracer, hop_tracer
from tests.unit_tests.routing.replica_sets import replica_set
from tests.unit_tests.routing_workers import new_session

pytestmark = pytest.mark.anyio

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
TRACESTATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"


def trace_headers(echo: dict) -> dict[str, str]:
    return {name: value for name, value in echo["headers"] if name in ("traceparent", "tracestate")}


async def test_traceparent_and_tracestate_reach_the_owners_handler_unchanged_across_a_worker_forward(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    response = await caller.post(b, "/echo/x", cookies, headers={"traceparent": TRACEPARENT, "tracestate": TRACESTATE})
    echo = await response.json()
    assert echo["worker"] == a.server.worker_id
    assert trace_headers(echo) == {"traceparent": TRACEPARENT, "tracestate": TRACESTATE}


async def test_traceparent_reaches_the_owners_handler_across_a_replica_forward():
    async with replica_set() as ((r1, r2), caller):
        owner = r1.workers[0]
        cookies = await new_session(caller, owner)
        response = await caller.post(r2.workers[1], "/echo/x", cookies, headers={"traceparent": TRACEPARENT, "tracestate": TRACESTATE})
        echo = await response.json()
        assert echo["worker"] == owner.server.worker_id
        assert trace_headers(echo) == {"traceparent": TRACEPARENT, "tracestate": TRACESTATE}


async def test_with_a_tracer_provider_a_forward_is_a_span_of_the_callers_trace_and_the_owner_sees_the_span(pair):
    a, b, caller = pair
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    b.server.forwarder.tracer = HopTracer(provider, "worker")
    cookies = await new_session(caller, a)
    response = await caller.post(b, "/echo/x", cookies, headers={"traceparent": TRACEPARENT, "tracestate": TRACESTATE})
    echo = await response.json()
    (span,) = exporter.get_finished_spans()
    assert span.context.trace_id == int(TRACE_ID, 16) and span.parent.span_id == 0x00F067AA0BA902B7
    assert span.attributes["nemo_gym.owner"] == a.server.worker_id and span.attributes["http.response.status_code"] == 200
    assert trace_headers(echo) == {"traceparent": f"00-{TRACE_ID}-{span.context.span_id:016x}-01", "tracestate": TRACESTATE}


def test_no_tracer_without_opentelemetry_loaded_and_nothing_of_it_imported(monkeypatch):
    for name in [name for name in sys.modules if name.startswith("opentelemetry")]:
        monkeypatch.delitem(sys.modules, name)
    assert hop_tracer("worker") is None
    assert "opentelemetry.trace" not in sys.modules


def test_no_tracer_while_no_tracer_provider_is_set():
    from opentelemetry import trace

    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    assert hop_tracer("worker") is None
