"""`tripwire intercept`: mitmproxy's DumpMaster with the Tripwire addon, in this process.

The same as `mitmdump -s addons/tripwire_addon.py ...`, but driven by Tripwire's own flags (the
serve flags become the addon's settings sources). Imported only when mitmproxy is installed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from typing import Any

from mitmproxy import exceptions, options
from mitmproxy.tools.dump import DumpMaster

from addons.tripwire_addon import TripwireAddon

# Tripwire's --log-level -> mitmproxy's termlog_verbosity
VERBOSITY = {"DEBUG": "debug", "INFO": "info", "WARNING": "warn", "ERROR": "error"}


def mitm_options(args: argparse.Namespace) -> dict[str, Any]:
    """mitmproxy options from the intercept flags (pure: the CLI test checks it without mitmproxy running)."""
    opts: dict[str, Any] = {
        "listen_host": args.listen_host,
        "listen_port": args.listen_port,
        "mode": [args.mode],
        "termlog_verbosity": VERBOSITY.get(args.log_level, "info"),
        "tripwire_listen": args.listen or "127.0.0.1:0",
    }
    if args.intercept:
        opts["tripwire_hosts"] = list(args.intercept)
    if args.no_viewer:
        opts["tripwire_admin_listen"] = "off"
    if args.confdir:
        opts["confdir"] = args.confdir
    return opts


async def serve_mitm(args: argparse.Namespace, addon: TripwireAddon) -> int:
    logging.getLogger().setLevel(logging.DEBUG)  # mitmproxy's termlog filters by termlog_verbosity
    opts = options.Options()
    master = DumpMaster(opts, with_termlog=True, with_dumper=False)
    master.addons.add(addon)
    try:
        opts.update(**mitm_options(args))
        if args.mitm_set:
            opts.set(*args.mitm_set)
    except exceptions.OptionsError as e:
        print(f"tripwire intercept: {e}", flush=True)
        return 2
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, master.shutdown)
    await master.run()
    return 1 if addon.error else 0


def run(args: argparse.Namespace, cli: dict[str, Any], *, argv: list[str]) -> int:
    addon = TripwireAddon(cli=cli, config_file=args.config, argv=argv)
    return asyncio.run(serve_mitm(args, addon))
