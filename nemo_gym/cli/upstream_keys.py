"""Upstream's command keys (``+input_glob=... +output_jsonl_fpath=...``, as its ``ng_*`` commands take them) read
as this command line's flags, so an upstream invocation runs unchanged; other ``+key=value`` tokens stay config keys."""

from __future__ import annotations

# ``gym`` command -> upstream key -> flag. A flag of a switch takes no value: the key set true gives it, false omits it;
# a key whose flag starts with ``--no-`` gives it when set false.
KEYS: dict[tuple[str, str], dict[str, str]] = {
    ("eval", "run"): {
        "agent_name": "--agent", "input_jsonl_fpath": "--input", "output_jsonl_fpath": "--output", "limit": "--limit",
        "num_repeats": "--num-repeats", "num_samples_in_parallel": "--concurrency",
    },
    ("eval", "prepare"): {"use_cached_prepared_benchmarks": "--use-cached"},
    ("eval", "aggregate"): {"input_glob": "--input-glob", "output_jsonl_fpath": "--output", "merge_shards": "--no-merge-shards"},
    ("eval", "reverify"): {
        "materialized_inputs_jsonl_fpath": "--inputs", "rollouts_jsonl_fpath": "--rollouts", "output_jsonl_fpath": "--output",
        "num_samples_in_parallel": "--concurrency", "limit": "--limit", "force": "--force", "overwrite": "--overwrite",
        "disable_aggregation": "--disable-aggregation", "resume_from_cache": "--resume",
    },
    ("eval", "profile"): {"materialized_inputs_jsonl_fpath": "--inputs", "rollouts_jsonl_fpath": "--rollouts", "allow_partial_rollouts": "--allow-partial-rollouts"},
    ("dataset", "render"): {"input_jsonl_fpath": "--input", "prompt_config": "--prompt-config", "output_jsonl_fpath": "--output"},
    ("dataset", "collate"): {"mode": "--mode", "output_dirpath": "--output-dir", "should_download": "--download", "overwrite_metrics_conflicts": "--overwrite-metrics-conflicts"},
}
SWITCHES = frozenset({"--use-cached", "--no-merge-shards", "--force", "--overwrite", "--resume", "--disable-aggregation", "--download", "--overwrite-metrics-conflicts", "--allow-partial-rollouts"})


def truthy(value: str) -> bool:
    return value.strip().strip("'\"").lower() in ("true", "1", "yes")


def as_flags(argv: list[str]) -> list[str]:
    """``argv`` with each upstream key of its command as that command's flag."""
    keys = KEYS.get(tuple(argv[:2]), {})
    tokens: list[str] = []
    for token in argv:
        key, separator, value = token.lstrip("+").partition("=")
        flag = keys.get(key) if token.startswith("+") and separator else None
        if flag is None:
            tokens.append(token)
        elif flag in SWITCHES:
            tokens += [flag] if truthy(value) != flag.startswith("--no-") else []
        else:
            tokens += [flag, value]
    return tokens


def gives_config_paths(overrides: list[str]) -> bool:
    """Whether the overrides name config files (upstream's ``+config_paths=[...]``), which stand for ``--config``."""
    return any(token.lstrip("+").partition("=")[0] == "config_paths" for token in overrides)
