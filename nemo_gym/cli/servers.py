"""``gym list``: the servers the search roots hold, and where."""

from __future__ import annotations

import argparse

from nemo_gym.config.paths import search_roots, servers_found


def list_servers(args: argparse.Namespace) -> int:
    """One row per server directory (one with an ``app.py``); a name in two roots shows the one configs would use."""
    rows = [("type", "name", "path")] + [(kind, name, str(path)) for kind, name, path in servers_found(search_roots(args.search_dir))]
    widths = [max(len(row[column]) for row in rows) for column in range(2)]
    for kind, name, path in rows:
        print(f"{kind.ljust(widths[0])}  {name.ljust(widths[1])}  {path}")
    return 0
