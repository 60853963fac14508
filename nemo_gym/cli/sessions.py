"""``gym sessions export|restore|checkpoint``: every durable session of an instance, to one file and back, and a checkpoint of a live run."""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from urllib.parse import urlencode

import aiohttp

from nemo_gym.durable.checkpoint import DEFAULT_HOLD_SECONDS
from nemo_gym.durable.checkpoint_admin import ADMIN_PREFIX, DEFAULT_DRAIN_SECONDS, DEFAULT_PAUSE_SECONDS, admin_credentials, admin_header, merged
from nemo_gym.durable.store import open_store
from nemo_gym.durable.transfer import export_sessions, restore_sessions, write_sessions
from nemo_gym.sessions.secret import read as read_secret, state_dir

CHECKPOINT_REQUEST_SLACK_SECONDS = 10


class CheckpointFailed(RuntimeError):
    """A replica did not drain, pause or export; every replica was resumed and no file written."""


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


async def take_checkpoint(args: argparse.Namespace) -> tuple[int, float]:
    """Drain every replica (each returns once its requests in flight are done, serving meanwhile), pause
    every replica (each refuses new requests and returns once those admitted since are done), export each,
    write the file whole, and resume every replica, whatever happened; returns the sessions written and the
    seconds from the first pause to the end."""
    secret = read_secret(Path(args.secret_file) if args.secret_file else state_dir() / "secrets" / args.instance)
    credentials = admin_credentials(secret)
    urls = [url.rstrip("/") for url in args.url]
    timeout = aiohttp.ClientTimeout(total=max(args.drain_seconds, args.hold_seconds) + CHECKPOINT_REQUEST_SLACK_SECONDS)
    async with aiohttp.ClientSession(timeout=timeout, cookie_jar=aiohttp.DummyCookieJar()) as http:

        async def call(url: str, action: str, query: dict | None = None) -> dict:
            target = ADMIN_PREFIX + action + (f"?{urlencode(query)}" if query else "")
            name, value = admin_header(credentials, "POST", target, args.instance)
            try:
                async with http.post(url + target, headers={name: value}) as reply:
                    body = await reply.json(content_type=None)
                    if reply.status != 200:
                        raise CheckpointFailed(f"{url} answered {action} with {reply.status}: {body.get('detail') if isinstance(body, dict) else body}")
                    return body
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as error:
                raise CheckpointFailed(f"{url} did not answer {action}: {error!r}") from None

        try:
            await asyncio.gather(*(call(url, "drain", {"seconds": args.drain_seconds}) for url in urls))
            began = time.monotonic()
            pause = {"seconds": args.pause_seconds, "hold_seconds": args.hold_seconds}
            await asyncio.gather(*(call(url, "pause", pause) for url in urls))
            exports = await asyncio.gather(*(call(url, "export") for url in urls))
            count = write_sessions(merged([export["sessions"] for export in exports]), args.instance, Path(args.output))
        finally:
            await asyncio.gather(*(call(url, "resume") for url in urls), return_exceptions=True)
        return count, time.monotonic() - began


def checkpoint(args: argparse.Namespace) -> int:
    try:
        count, paused = asyncio.run(take_checkpoint(args))
    except CheckpointFailed as error:
        print(f"no checkpoint of {args.instance} written: {error}; every replica was asked to resume")
        return 1
    print(f"checkpointed {count} sessions of {args.instance} from {len(args.url)} replicas to {args.output} (paused {paused:.2f} s)")
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
    point = parser.add_parser("checkpoint", help="pause every replica of a running instance, export its sessions to one file, resume")
    point.add_argument("--instance", required=True)
    point.add_argument("--url", required=True, action="append", help="a replica's own URL (not a balancer's); once per replica")
    point.add_argument("--output", required=True, help="file to write, as `gym sessions export` does")
    point.add_argument("--secret-file", help="file holding the instance's session_secret (default: its file in NEMO_GYM_STATE_DIR/secrets/)")
    point.add_argument("--pause-seconds", type=float, default=DEFAULT_PAUSE_SECONDS, help="a pause ends by itself this long after it began (if this command dies)")
    drain_help = "how long each replica waits for the requests in flight when the checkpoint begins, serving meanwhile"
    point.add_argument("--drain-seconds", type=float, default=DEFAULT_DRAIN_SECONDS, help=drain_help)
    hold_help = "how long each paused replica waits for the requests admitted since, refusing new ones (503) meanwhile"
    point.add_argument("--hold-seconds", type=float, default=DEFAULT_HOLD_SECONDS, help=hold_help)
    point.set_defaults(handler=checkpoint)
