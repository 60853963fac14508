"""Traces across a forward: a span for each hop a request makes to its owner, where OpenTelemetry is set up.

The forwarder passes a request's headers on unchanged, W3C ``traceparent`` and ``tracestate`` among
them, so without tracing here a trace still runs from the caller through the receiving worker to the
owner's handler. Where a tracer provider is configured (by the server's module, or by
``opentelemetry-instrument``, before the app is built), each hop is a span, a child of the context the
request came with (or a new trace's root), and the owner gets that span's context in their place: one
trace spans the caller, the receiving worker and the owner. Where none is, nothing of OpenTelemetry is
imported or called (``hop_tracer`` gives None); it is an optional extra (``pip install '.[tracing]'``).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from starlette.types import Message, Scope, Send

TRACE_HEADERS = (b"traceparent", b"tracestate")


def hop_tracer(hop: str) -> "HopTracer | None":
    """A tracer of ``hop`` ("worker" or "replica") forwards if OpenTelemetry's API is loaded and a tracer provider set; else None."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    return HopTracer(provider, hop)


class HopTracer:
    def __init__(self, provider: Any, hop: str) -> None:
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.tracer = provider.get_tracer("nemo_gym.routing")
        self.propagator = TraceContextTextMapPropagator()
        self.kind = SpanKind.CLIENT
        self.hop = hop

    @contextlib.contextmanager
    def span(self, owner: str, scope: Scope, send: Send) -> Iterator[tuple[Scope, Send]]:
        """The hop's span, current while it lasts; gives the scope to forward (the span's trace headers in
        place of the caller's) and a ``send`` that records the reply's status on the span."""
        carrier = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"] if name in TRACE_HEADERS}
        attributes = {"nemo_gym.hop": self.hop, "nemo_gym.owner": owner, "http.request.method": scope["method"], "url.path": scope["path"]}
        parent = self.propagator.extract(carrier)
        with self.tracer.start_as_current_span(f"nemo_gym forward to {self.hop}", context=parent, kind=self.kind, attributes=attributes) as span:
            injected: dict[str, str] = {}
            self.propagator.inject(injected)
            headers = [header for header in scope["headers"] if header[0] not in TRACE_HEADERS]
            headers += [(name.encode("latin-1"), value.encode("latin-1")) for name, value in injected.items()]

            async def send_recorded(message: Message) -> None:
                if message["type"] == "http.response.start":
                    span.set_attribute("http.response.status_code", message["status"])
                await send(message)

            yield {**scope, "headers": headers}, send_recorded
