"""What the search roots offer, by kind, read from the config files alone (nothing imported or started): upstream's
``gym list`` catalog of resources servers, agents, models (one entry per config flavor), benchmarks and environments."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nemo_gym.config.paths import SERVER_TYPES

# ``gym list`` kind -> (the folder of each root it reads, the server type a listed config defines; None: any).
KINDS = {
    "resources-servers": ("resources_servers", "resources_servers"),
    "agents": ("responses_api_agents", "responses_api_agents"),
    "models": ("responses_api_models", "responses_api_models"),
    "benchmarks": ("benchmarks", None),
    "environments": ("environments", None),
}


@dataclass
class Entry:
    name: str
    config: Path
    domain: str | None = None
    description: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "domain": self.domain, "description": self.description, **self.extra}


def read(path: Path) -> dict:
    """A config's top level, or {} for a file that is not a YAML mapping (a catalog lists what it can read)."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def servers(data: dict) -> list[tuple[str, str, dict]]:
    """(instance, server type, settings) of every ``{instance: {type: {implementation: settings}}}`` block."""
    found = []
    for instance, body in data.items():
        if isinstance(body, dict):
            for server_type in SERVER_TYPES:
                for settings in (body.get(server_type) or {}).values() if isinstance(body.get(server_type), dict) else []:
                    if isinstance(settings, dict):
                        found.append((str(instance), server_type, settings))
    return found


def metadata(data: dict) -> tuple[str | None, str | None]:
    """The first ``domain`` and the first ``description`` of the config's servers."""
    blocks = [settings for _, _, settings in servers(data)]
    domain = next((str(s["domain"]) for s in blocks if s.get("domain")), None)
    description = next((str(s["description"]) for s in blocks if s.get("description")), None)
    return domain, description


def benchmark_of(data: dict) -> dict[str, Any] | None:
    """The agent and repeats of the config's ``type: benchmark`` dataset, or None."""
    for instance, server_type, settings in servers(data):
        for dataset in settings.get("datasets") or [] if server_type == "responses_api_agents" else []:
            if isinstance(dataset, dict) and dataset.get("type") == "benchmark":
                return {"agent_name": instance, "num_repeats": dataset.get("num_repeats", 1)}
    return None


def entries_in(folder: Path, kind: str) -> list[Entry]:
    _, server_type = KINDS[kind]
    entries = []
    if kind in ("benchmarks", "environments"):
        for config in sorted(folder.glob("**/*.yaml")):
            relative = config.relative_to(folder).with_suffix("")
            name = relative.parent.as_posix() if relative.name == "config" and len(relative.parts) == 2 else relative.as_posix()
            data = read(config)
            extra = benchmark_of(data)
            if (kind == "benchmarks") == (extra is not None) and servers(data):
                entries.append(Entry(name, config, *metadata(data), extra or {}))
        return entries
    for config in sorted(folder.glob("*/configs/*.yaml")):
        directory = config.parent.parent.name
        data = read(config)
        if any(kind_of == server_type for _, kind_of, _ in servers(data)):
            entries.append(Entry(directory if config.stem == directory else f"{directory}/{config.stem}", config, *metadata(data)))
    return entries


def catalog(kind: str, roots: list[Path]) -> dict[str, Entry]:
    """Every entry of a kind in the roots, by name; a name found in two roots keeps the first (a user's shadows the install's)."""
    found: dict[str, Entry] = {}
    for root in roots:
        for entry in entries_in(root / KINDS[kind][0], kind):
            found.setdefault(entry.name, entry)
    return found
