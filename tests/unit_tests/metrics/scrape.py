"""Reading a ``GET /metrics`` answer with prometheus_client's own text parser."""

from __future__ import annotations

import http.client

from prometheus_client.parser import text_string_to_metric_families

SCRAPE_TIMEOUT_SECONDS = 60


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


def summed(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples that carry ``labels`` (and any others): over an instance's workers, say."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and all(f'{key}="{value}"' in line for key, value in labels.items())
    )


def metric(url: str, name: str, **labels: str) -> float:
    """``summed`` over a server's ``GET /metrics`` answer (``url``: its root, ``http://host:port``)."""
    connection = http.client.HTTPConnection(url.split("//")[1], timeout=SCRAPE_TIMEOUT_SECONDS)
    connection.request("GET", "/metrics")
    try:
        return summed(connection.getresponse().read().decode(), name, **labels)
    finally:
        connection.close()
