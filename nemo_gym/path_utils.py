"""Paths derived from a rollout output file."""

from pathlib import Path


def failures_path_for(output_fpath: Path) -> Path:
    """The file of a run's failed rollouts: beside its output, ``<stem>_failures.jsonl``."""
    return output_fpath.with_name(f"{output_fpath.stem}_failures.jsonl")
