"""The scoring rule of upstream_siblings, a module next to its app.py that the app imports bare."""


def score(answer: str, expected: str) -> float:
    return 1.0 if answer.strip().lower() == expected.strip().lower() else 0.0
