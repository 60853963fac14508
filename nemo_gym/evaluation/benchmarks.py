"""Benchmark datasets: the ``type: benchmark`` dataset an agent of a config declares, and its prepare script,
which writes the dataset's JSONL (upstream's ``gym eval prepare``)."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_gym.config import is_instance
from nemo_gym.config.files import ConfigError, instance_kind
from nemo_gym.config_types import DatasetConfig


@dataclass
class Benchmark:
    agent: str
    dataset: DatasetConfig
    # Where the prepare script and the dataset are: the working directory or the first search root that has the script.
    root: Path

    @property
    def prepare_script(self) -> Path:
        return self.root / self.dataset.prepare_script

    @property
    def jsonl_path(self) -> Path:
        return self.root / self.dataset.jsonl_fpath


def root_of(relative: str, roots: list[Path]) -> Path:
    """The working directory when it has the file, else the first search root that has it (else the working directory)."""
    return next((root.resolve() for root in [Path.cwd(), *roots] if (root / relative).is_file()), Path.cwd().resolve())


def benchmarks_of(data: dict[str, Any], roots: list[Path]) -> list[Benchmark]:
    """One benchmark per agent instance that declares a benchmark dataset; more than one on an agent is an error."""
    found = []
    for name, body in data.items():
        if not is_instance(str(name), body) or (instance_kind(body) or ("",))[0] != "responses_api_agents":
            continue
        settings = next(iter(body["responses_api_agents"].values())) or {}
        datasets = [DatasetConfig.model_validate(item) for item in settings.get("datasets") or [] if item.get("type") == "benchmark"]
        if len(datasets) > 1:
            raise ConfigError(f"{name}: a benchmark config defines one benchmark dataset; found {[d.name for d in datasets]}")
        for dataset in datasets:
            if not dataset.prepare_script:
                raise ConfigError(f"{name}: benchmark dataset {dataset.name!r} has no prepare_script")
            found.append(Benchmark(str(name), dataset, root_of(dataset.prepare_script, roots)))
    return found


def prepare_function(benchmark: Benchmark):
    """The script's ``prepare``, imported under its dotted path, with the benchmark's root on ``sys.path``."""
    script = Path(benchmark.dataset.prepare_script)
    if not benchmark.prepare_script.is_file():
        raise ConfigError(f"benchmark {benchmark.dataset.name!r}: no prepare script {benchmark.prepare_script}")
    if str(benchmark.root) not in sys.path:
        sys.path.insert(0, str(benchmark.root))
    # Loaded from this file even when a same-named script of another root was imported before.
    name = ".".join(script.with_suffix("").parts)
    spec = importlib.util.spec_from_file_location(name, benchmark.prepare_script)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "prepare"):
        raise ConfigError(f"benchmark {benchmark.dataset.name!r}: {benchmark.prepare_script} has no prepare function")
    return module.prepare


def prepare(benchmark: Benchmark, arguments: dict[str, Any]) -> Path:
    """Run the prepare script; the file it returns must be the dataset's ``jsonl_fpath``."""
    written = Path(prepare_function(benchmark)(**arguments))
    if written.resolve() != benchmark.jsonl_path.resolve():
        raise ConfigError(
            f"benchmark {benchmark.dataset.name!r}: the prepare script wrote {written}, which does not match the jsonl_fpath of the config ({benchmark.jsonl_path})"
        )
    return written
