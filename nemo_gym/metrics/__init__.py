"""Metrics: ``GET /metrics`` on every server, in Prometheus's text format, aggregated over an instance's workers.

- ``meters``: the metrics a process keeps, the holder (``METERS``) the code where each thing happens counts
  on, and ``session_ended(reason)``.
- ``exposition``: the per-instance multi-process directory, and the text a scrape answers with.
- ``layers``: the ASGI layers: the endpoint (which also counts replies by status) and served-here counting.

docs/metrics.md lists every metric.
"""

from nemo_gym.metrics.meters import METERS, session_ended

__all__ = ["METERS", "session_ended"]
