"""``gym list``: the servers the search roots hold, and where; ``gym list <kind> [NAME]``: upstream's catalog of a kind."""

from __future__ import annotations

import argparse
import difflib
import json

from nemo_gym.config.catalog import KINDS, Entry, catalog
from nemo_gym.config.paths import search_roots, servers_found

# How one entry of a kind is started (the inspect view's usage line).
USAGE = {
    "resources-servers": "gym env start --resources-server {name}",
    "agents": "gym env start --config {config}",
    "models": "gym env start --config {config}",
    "benchmarks": "gym eval prepare --benchmark {name}",
    "environments": "gym env start --config {config}",
}


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]) - 1)]
    return "\n".join("  ".join([*(cell.ljust(width) for cell, width in zip(row, widths)), row[-1]]).rstrip() for row in rows)


def list_servers(args: argparse.Namespace) -> int:
    """One row per server directory (one with an ``app.py``); a name in two roots shows the one configs would use."""
    if args.kind:
        return list_kind(args)
    rows = [("type", "name", "path")] + [(kind, name, str(path)) for kind, name, path in servers_found(search_roots(args.search_dir))]
    print(table(rows))
    return 0


def inspect(args: argparse.Namespace, entries: dict[str, Entry]) -> int:
    noun = args.kind.removesuffix("s").replace("-", " ")
    if args.name not in entries:
        close = difflib.get_close_matches(args.name, list(entries), n=3)
        raise ValueError(f"no {noun} named {args.name!r}" + (f"; did you mean {', '.join(close)}?" if close else f"; see `gym list {args.kind}`"))
    entry = entries[args.name]
    details = {**entry.to_dict(), "config": str(entry.config), "usage": USAGE[args.kind].format(name=entry.name, config=entry.config)}
    if args.json:
        print(json.dumps(details))
    else:
        print("\n".join(f"{key}: {value}" for key, value in details.items() if value is not None))
    return 0


def list_kind(args: argparse.Namespace) -> int:
    entries = catalog(args.kind, search_roots(args.search_dir))
    if args.name:
        return inspect(args, entries)
    if args.json:
        print(json.dumps([entry.to_dict() for entry in entries.values()]))
        return 0
    extra_columns = ["agent_name", "num_repeats"] if args.kind == "benchmarks" else []
    rows = [("Name", "Domain", *(c.replace("_", " ").capitalize() for c in extra_columns), "Description")]
    rows += [(e.name, e.domain or "", *(str(e.extra[c]) for c in extra_columns), e.description or "") for e in entries.values()]
    print(f"Available {args.kind.replace('-', ' ')} in NeMo Gym ({len(entries)})")
    print(table(rows))
    return 0


def add_commands(groups: argparse._SubParsersAction, add_search_dir) -> None:
    listing = groups.add_parser("list", help="list the servers found in the search roots (type, name, path), or one kind of upstream's catalog")
    listing.add_argument("kind", nargs="?", choices=sorted(KINDS), help="list this kind: one entry per config, with domain and description")
    listing.add_argument("name", nargs="?", metavar="NAME", help="inspect one entry of the kind")
    listing.add_argument("--json", action="store_true", help="with a kind: machine-readable JSON")
    add_search_dir(listing)
    listing.set_defaults(handler=list_servers)
