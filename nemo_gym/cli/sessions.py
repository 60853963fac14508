"""``gym sessions export|restore``: every durable session of an instance, to one file and back."""

from __future__ import annotations

import argparse
from pathlib import Path

from nemo_gym.durable.store import open_store
from nemo_gym.durable.transfer import export_sessions, restore_sessions


def export(args: argparse.Namespace) -> int:
    store = open_store(args.store, args.instance, create=False)
    try:
        count = export_sessions(store, args.instance, Path(args.output))
    finally:
        store.close()
    print(f"exported {count} sessions of {args.instance} to {args.output}")
    return 0


def restore(args: argparse.Namespace) -> int:
    store = open_store(args.store, args.instance)
    try:
        outcome = restore_sessions(store, args.instance, Path(args.input))
    finally:
        store.close()
    skipped = f" ({outcome.expired} had expired and {'was' if outcome.expired == 1 else 'were'} skipped)" if outcome.expired else ""
    print(f"restored {outcome.restored} sessions of {args.instance} from {args.input}{skipped}; a live worker takes each up on its first request")
    return 0


def add_commands(groups: argparse._SubParsersAction) -> None:
    parser = groups.add_parser("sessions", help="export or restore an instance's durable sessions").add_subparsers(dest="command", required=True)
    store_help = "the instance's session_store setting, if it has one (default: its file in NEMO_GYM_STATE_DIR/sessions/)"
    out = parser.add_parser("export", help="write every durable session of an instance to one file")
    out.add_argument("--instance", required=True, help="instance name")
    out.add_argument("--store", help=store_help)
    out.add_argument("--output", required=True, help="file to write")
    out.set_defaults(handler=export)
    back = parser.add_parser("restore", help="load a file from `gym sessions export` into an instance's store, all or nothing")
    back.add_argument("--instance", required=True)
    back.add_argument("--store", help=store_help)
    back.add_argument("--input", required=True, help="file written by `gym sessions export`")
    back.set_defaults(handler=restore)
