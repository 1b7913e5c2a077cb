"""`tripwire keys create|list|revoke`: agent keys (SPEC §9, docs/gateway.md), on the key store
`tripwire serve` uses with the same settings (the data dir, or the shared state when `state` is set).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from proxy.agent_keys import AgentKey, KeyRequestError, KeyStore, key_store_for, parse_duration
from proxy.settings import ConfigError, load_settings

KEYS_EPILOG = """\
The key is printed once; only its hash is kept (the data dir's agent-keys.json, or the shared state
when `state` is set, so every replica knows it). Give it to the agent as its API key
(OPENAI_API_KEY, ANTHROPIC_API_KEY, an MCP bearer token). With `auth: {require_agent_key: true}`
every call must carry one, and it names the agent. A running serve sees a new key or a revocation
within a second (the data dir) or on its next call (shared state). See docs/gateway.md.
"""


def add_keys_parser(sub: Any) -> None:
    keys = sub.add_parser(
        "keys",
        help="create, list and revoke agent keys (gateway mode)",
        description="Agent keys: who may call the proxy listener, and as which agent.",
        epilog=KEYS_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = argparse.ArgumentParser(add_help=False)
    c = common.add_argument
    c(
        "--data-dir",
        metavar="DIR",
        help="the data dir serve uses (env TRIPWIRE_DATA_DIR, default ~/.tripwire)",
    )
    c("--config", metavar="FILE", type=Path, help="serve's YAML config (its data_dir and state apply)")
    c("--state", metavar="URL", help="the shared state serve uses, e.g. redis://redis:6379/0")
    c("--json", action="store_true", help="print JSON")
    actions = keys.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    create = actions.add_parser("create", parents=[common], help="make a key for an agent (printed once)")
    create.add_argument("--agent", required=True, metavar="NAME", help="the agent the key names")
    create.add_argument("--expires", metavar="DURATION", help="e.g. 30d, 12h, 90m (default: never)")
    create.add_argument("--note", metavar="TEXT", help="a note for people (who holds it, what for)")
    actions.add_parser("list", parents=[common], help="list keys (never the keys themselves)")
    revoke = actions.add_parser("revoke", parents=[common], help="revoke a key by its id")
    revoke.add_argument("id", metavar="ID", help="the key's id (key_...), as `keys list` shows it")


def store_from_args(args: argparse.Namespace) -> KeyStore:
    cli: dict[str, Any] = {}
    if args.data_dir:
        cli["data_dir"] = args.data_dir
    if args.state:
        cli["state"] = {"url": args.state}
    settings = load_settings(cli, config_file=args.config)
    return key_store_for(settings.resolved_data_dir(), settings.state.url)


def when(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def status(record: AgentKey) -> str:
    if record.revoked is not None:
        return "revoked"
    return "active" if record.usable_at(datetime.now(UTC).timestamp()) else "expired"


async def keys_command(args: argparse.Namespace, store: KeyStore) -> int:
    try:
        if args.keys_command == "create":
            expires = parse_duration(args.expires) if args.expires else None
            record, secret = await store.create(args.agent, expires, args.note)
            if args.json:
                print(orjson.dumps({**record.public(), "key": secret}).decode())
            else:
                print(secret)
                print(
                    f"agent key {record.id} for agent {record.agent!r} (expires: {when(record.expires)}); "
                    "shown once, only its hash is kept",
                    file=sys.stderr,
                )
            return 0
        if args.keys_command == "list":
            records = await store.list()
            if args.json:
                print(orjson.dumps([{**r.public(), "status": status(r)} for r in records]).decode())
                return 0
            print(f"{'ID':22} {'AGENT':20} {'STATUS':8} {'CREATED':21} {'EXPIRES':21} NOTE")
            for r in records:
                line = f"{r.id:22} {r.agent:20} {status(r):8} {when(r.created):21} {when(r.expires):21} {r.note or ''}"
                print(line)
            return 0
        record_or_none = await store.revoke(args.id)
        if record_or_none is None:
            print(f"tripwire keys revoke: no key {args.id!r} (see `tripwire keys list`)", file=sys.stderr)
            return 1
        print(orjson.dumps(record_or_none.public()).decode() if args.json else f"revoked {args.id}")
        return 0
    except KeyRequestError as e:
        print(f"tripwire keys {args.keys_command}: {e}", file=sys.stderr)
        return 2


def run_keys(args: argparse.Namespace) -> int:
    try:
        store = store_from_args(args)
    except ConfigError as e:
        print(f"tripwire: {e}", file=sys.stderr)
        return 2

    async def run() -> int:
        try:
            return await keys_command(args, store)
        finally:
            await store.close()

    try:
        return asyncio.run(run())
    except OSError as e:
        print(f"tripwire keys: cannot reach the key store: {e}", file=sys.stderr)
        return 1
