"""Reading a ``GET /metrics`` answer with prometheus_client's own text parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the exposition: (name, sorted labels) -> value."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(text: str, name: str, **labels: str) -> float:
    """One sample's value; 0 for a sample the exposition does not have (a counter never counted)."""
    return samples(text).get((name, tuple(sorted(labels.items()))), 0.0)
