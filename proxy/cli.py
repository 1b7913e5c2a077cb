"""`tripwire` command line."""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proxy import __version__
from proxy.cli_keys import add_keys_parser, run_keys
from proxy.mcp.aggregate.names import aggregate_problems
from proxy.settings import ConfigError, Settings, is_loopback, load_settings, split_host_port

EPILOG = """\
Point your agent at the proxy with no code change:
  export OPENAI_BASE_URL=http://127.0.0.1:8713/v1
  export OPENAI_BASE_URL=http://127.0.0.1:8713/agents/research-agent/v1   (names the agent)
MCP servers are reached at http://127.0.0.1:8713/mcp/NAME. The viewer is on the admin listener.
Configuration precedence: flags > TRIPWIRE_* environment > --config or .tripwire/config.yaml
> ~/.tripwire/config.yaml > defaults. See docs/configuration.md.
"""


def _name_value(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tripwire",
        description="Tripwire: a local proxy between AI agents and their LLM APIs and MCP servers. "
        "It records every call as an AgentDbg trace, detects loops, enforces budgets and runs circuit breakers.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"tripwire {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="run the proxy and the admin listener (viewer, API, /metrics)",
        description="Run the proxy listener (agent traffic) and the admin listener (viewer, JSON API, "
        "/metrics, /healthz, /readyz). Needs no database or other service.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_serve_flags(serve)
    add_intercept_parser(sub)
    add_replay_parser(sub)
    add_keys_parser(sub)
    return parser


def add_serve_flags(serve: argparse.ArgumentParser) -> None:
    """The proxy's flags, shared by `serve` and `intercept` (the same engine runs behind both)."""
    a = serve.add_argument
    a("--listen", metavar="HOST:PORT", help="proxy listener for agent traffic (default 127.0.0.1:8713)")
    a(
        "--admin-listen",
        metavar="HOST:PORT",
        help="admin listener: viewer, API, metrics (default 127.0.0.1:8714)",
    )
    a(
        "--upstream",
        metavar="URL",
        help="default OpenAI-compatible upstream for /v1/... (default https://api.openai.com)",
    )
    a(
        "--llm",
        metavar="NAME=URL",
        action="append",
        type=_name_value,
        default=[],
        help="a named LLM upstream served at /llm/NAME/... (repeatable), e.g. anthropic=https://api.anthropic.com",
    )
    a(
        "--mcp",
        metavar="NAME=URL",
        action="append",
        type=_name_value,
        default=[],
        help="an MCP server (Streamable HTTP or legacy SSE URL) served at /mcp/NAME (repeatable)",
    )
    a(
        "--mcp-stdio",
        metavar='NAME="CMD ARGS"',
        action="append",
        type=_name_value,
        default=[],
        help="a stdio MCP server started as a child process and served at /mcp/NAME (repeatable)",
    )
    a("--agent", metavar="NAME", help="agent name when a request names none (default 'default')")
    a("--data-dir", metavar="DIR", help="where runs are written (env TRIPWIRE_DATA_DIR, default ~/.tripwire)")
    a("--config", metavar="FILE", type=Path, help="YAML config file (instead of .tripwire/config.yaml)")
    a(
        "--session-idle-timeout",
        metavar="SECONDS",
        type=float,
        help="an automatic session ends after this long without traffic (default 300)",
    )
    a(
        "--admin-token",
        metavar="TOKEN",
        help="bearer token required on the admin JSON API (env TRIPWIRE_ADMIN_TOKEN); mandatory off loopback",
    )
    a("--connect-timeout", metavar="SECONDS", type=float, help="upstream connect timeout (default 10)")
    a(
        "--ttfb-timeout",
        metavar="SECONDS",
        type=float,
        help="upstream time to first byte, and longest silence inside a stream (default 600)",
    )
    a(
        "--max-body-bytes",
        metavar="BYTES",
        type=int,
        help="largest request body; larger gets 413 (default 32 MiB)",
    )
    a(
        "--event-loop",
        choices=["uvloop", "asyncio"],
        help="the proxy's event loop: uvloop (default where installed) or asyncio's own",
    )
    a(
        "--drain-grace",
        metavar="SECONDS",
        type=float,
        help="on SIGTERM, how long in-flight calls and streams may finish (default 20)",
    )
    a("--fsync", choices=["never", "run_end", "always"], help="trace durability policy (default run_end)")
    a(
        "--trace-writer",
        choices=["process", "loop"],
        help="write the trace's files on the event loop (default) or in a child process",
    )
    a(
        "--no-record-content",
        action="store_true",
        default=None,
        help="record metadata only (model, usage, cost, tool names, timings), no prompts or results",
    )
    a(
        "--state",
        metavar="URL",
        help="shared guard state for several replicas, e.g. redis://redis:6379/0 (default: in memory); "
        "see docs/scaling.md",
    )
    a(
        "--otlp-endpoint",
        metavar="URL",
        help="also export calls as OpenTelemetry spans over OTLP/HTTP, e.g. http://collector:4318 "
        "(needs pip install 'tripwire[otlp]'); see docs/scaling.md",
    )
    a(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log level (default INFO)",
    )


def cli_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Only the flags given: they sit on top of the other sources, field by field."""
    out: dict[str, Any] = {}
    simple = {
        "listen": "listen",
        "admin_listen": "admin_listen",
        "agent": "agent",
        "data_dir": "data_dir",
        "session_idle_timeout": "session_idle_timeout_s",
        "admin_token": "admin_token",
        "connect_timeout": "connect_timeout_s",
        "ttfb_timeout": "ttfb_timeout_s",
        "max_body_bytes": "max_body_bytes",
        "drain_grace": "drain_grace_s",
        "event_loop": "event_loop",
        "fsync": "fsync",
        "trace_writer": "trace_writer",
    }
    for flag, field in simple.items():
        value = getattr(args, flag)
        if value is not None:
            out[field] = value
    if args.upstream:
        out["upstream"] = {"url": args.upstream}
    if args.no_record_content:
        out["record_content"] = False
    if args.llm:
        out["llm"] = {name: {"url": url} for name, url in args.llm}
    if args.mcp:
        out["mcp"] = {name: {"url": url} for name, url in args.mcp}
    if args.mcp_stdio:
        out["mcp_stdio"] = {name: {"command": cmd} for name, cmd in args.mcp_stdio}
    if args.state:
        out["state"] = {"url": args.state}
    if args.otlp_endpoint:
        out["otlp"] = {"endpoint": args.otlp_endpoint}
    return out


def check_startup(settings: Settings) -> None:
    host, _ = split_host_port(settings.admin_listen)
    if not is_loopback(host) and not settings.admin_token:
        raise ConfigError(
            f"admin_listen {settings.admin_listen} is off loopback: set --admin-token or TRIPWIRE_ADMIN_TOKEN "
            "(the admin API can rename, delete and terminate runs and change guards)"
        )
    overlap = set(settings.mcp) & set(settings.mcp_stdio)
    if overlap:
        raise ConfigError(f"mcp and mcp_stdio both name {sorted(overlap)}: names must be unique")
    aggregate = aggregate_problems(settings)
    if aggregate:
        raise ConfigError("; ".join(aggregate))
    if settings.otlp.endpoint and not otlp_installed():
        raise ConfigError(
            f"otlp.endpoint {settings.otlp.endpoint} is set but the OpenTelemetry exporter is not installed: "
            "pip install 'tripwire[otlp]'"
        )


def otlp_installed() -> bool:
    """The `otlp` extra (opentelemetry-sdk and the OTLP/HTTP exporter) is importable."""
    try:
        return importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http") is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop (about a third less CPU per call than asyncio's, docs/benchmarks.md), unless
    asyncio's own is asked for or uvloop is not installed (Windows); None means asyncio's."""
    log = logging.getLogger("tripwire")
    if choice == "uvloop":
        try:
            import uvloop
        except ImportError:
            log.info("event loop: asyncio (uvloop is not installed)")
            return None
        log.info("event loop: uvloop %s", uvloop.__version__)
        return uvloop.new_event_loop
    log.info("event loop: asyncio")
    return None


# The cyclic collector's young generation, in objects (CPython's default: 700). A call's objects
# mostly die by reference count; a young collection walks the ones still alive, which under load
# are those of every call in flight: at 700 it ran every ~25 calls and cost ~3 us a call at c=32
# (gc.callbacks, thread CPU time), at 10,000 it runs ~15 times less often for the same walk.
YOUNG_GENERATION = 10_000


def collector_for_serving() -> None:
    """What start-up built so far (modules, the price snapshot's few thousand models) lives as long
    as the process: frozen out of the collector's way, so full collections do not walk it again and
    again; and a larger young generation (YOUNG_GENERATION)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_GENERATION, *gc.get_threshold()[1:])


def freeze_startup() -> None:
    """The listeners are up: the app, the engine and the config they built live as long as the
    process too (a full collection walked them: ~5 ms each, several a second under load)."""
    gc.collect()
    gc.freeze()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "intercept":
        return run_intercept(args, argv)
    if args.command == "replay":
        return run_replay(args)
    if args.command == "keys":
        return run_keys(args)
    if args.command != "serve":
        parser.print_help()
        return 0 if args.command is None else 2
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = load_settings(cli_overrides(args), config_file=args.config)
        check_startup(settings)
    except ConfigError as e:
        print(f"tripwire: {e}", file=sys.stderr)
        return 2
    from proxy.app import serve
    from proxy.pricing import load_snapshot

    load_snapshot()
    collector_for_serving()
    try:
        with asyncio.Runner(loop_factory=loop_factory(settings.event_loop)) as runner:
            runner.run(serve(settings, argv=["tripwire", *argv], ready=freeze_startup))
    except OSError as e:  # e.g. the port is taken
        print(f"tripwire: cannot start: {e}", file=sys.stderr)
        return 1
    return 0


# --- tripwire intercept: the same engine behind mitmproxy (addons/, docs/mitmproxy.md) ---------------

INTERCEPT_EPILOG = """\
Agents that cannot change a base URL: set HTTPS_PROXY=http://127.0.0.1:8080 in the agent's
environment and make it trust mitmproxy's CA (~/.mitmproxy/mitmproxy-ca-cert.pem, e.g. SSL_CERT_FILE).
Or run a reverse proxy in front of one API: --mode reverse:https://api.openai.com.
Calls to the intercepted hosts (default api.openai.com, api.anthropic.com) go through Tripwire;
everything else passes untouched. The serve flags work as for `tripwire serve`, except --listen:
here it is Tripwire's internal listener (default: any free 127.0.0.1 port). See docs/mitmproxy.md.
"""


def add_intercept_parser(sub: Any) -> None:
    """`tripwire intercept`: mitmproxy (optional extra) with the Tripwire addon, plus the serve flags."""
    p = sub.add_parser(
        "intercept",
        help="run mitmproxy with Tripwire inside (HTTPS_PROXY or reverse mode), for agents that cannot change a base URL",
        description="Run mitmproxy as a forward (HTTPS_PROXY) or reverse proxy whose calls to LLM APIs and MCP "
        "servers go through the same Tripwire engine as `tripwire serve`. Needs pip install 'tripwire[mitmproxy]'.",
        epilog=INTERCEPT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    a = p.add_argument
    a("--listen-host", default="127.0.0.1", help="mitmproxy's listen address (default 127.0.0.1)")
    a("--listen-port", type=int, default=8080, help="mitmproxy's listen port (default 8080)")
    a(
        "--mode",
        default="regular",
        help="mitmproxy mode: regular (HTTPS_PROXY, the default) or reverse:URL (e.g. reverse:https://api.openai.com)",
    )
    a(
        "--intercept",
        metavar="[SCHEME://]HOST[:PORT]=NAME",
        action="append",
        default=[],
        help="a host whose calls go through Tripwire, as upstream NAME (default, an --llm name, or mcp:NAME); "
        "repeatable, replaces the defaults api.openai.com=default and api.anthropic.com=anthropic",
    )
    a("--confdir", metavar="DIR", help="mitmproxy's directory for its CA (default ~/.mitmproxy)")
    a("--no-viewer", action="store_true", help="do not start the admin listener (viewer, API, /metrics)")
    a(
        "--set",
        metavar="OPTION=VALUE",
        action="append",
        default=[],
        dest="mitm_set",
        help="any other mitmproxy option (repeatable), e.g. --set ssl_insecure=true",
    )
    add_serve_flags(p)


def run_intercept(args: argparse.Namespace, argv: list[str]) -> int:
    try:
        from addons.intercept import run
    except ImportError as e:
        print(
            f"tripwire intercept needs mitmproxy ({e}): pip install 'tripwire[mitmproxy]' "
            "(on Python 3.11: pip install 'mitmproxy>=11' first, then tripwire; see docs/mitmproxy.md)",
            file=sys.stderr,
        )
        return 2
    try:  # fail here, with the field named, rather than inside mitmproxy
        settings = load_settings(cli_overrides(args), config_file=args.config)
        check_startup(settings)
    except ConfigError as e:
        print(f"tripwire: {e}", file=sys.stderr)
        return 2
    return run(args, cli_overrides(args), argv=["tripwire", *argv])


if __name__ == "__main__":
    raise SystemExit(main())


# --- tripwire replay: recorded runs through fresh guards (SPEC §5.7, docs/guards.md "Tuning") --------

REPLAY_EPILOG = """\
Replays each run's calls, in arrival order and with their recorded times, through fresh session
guards (loop detection, budgets, limits, turn time) and prints every decision other than allow.
By default each call is judged under the guard config that was in force for it, as recorded in the
run: the replay then takes exactly the decisions the live guards took. --config FILE (a YAML file in
the serve config's format; its guard sections and agent overrides) asks what that config would have
done instead. The circuit breaker and the kill switch are listed as recorded, not recomputed.
--json prints one array: {run_id, call_index, event_id, guard, kind, action} per decision
("replayed": false on the recorded-only ones). Exit 0 whether or not anything fired.
A run that cannot be replayed (no such run; a file that is not a regular file; a line of
events.jsonl that is not an event Tripwire or AgentDbg writes) is named on stderr in one line
(run, file and line); the other runs are still replayed and printed (--json's array holds them),
and the exit code is 2.
"""


def add_replay_parser(sub: Any) -> None:
    replay = sub.add_parser(
        "replay",
        help="replay recorded runs through the guards (what would this config have done?)",
        description="Feed recorded runs through fresh session guards and print what fired.",
        epilog=REPLAY_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    a = replay.add_argument
    a("runs", nargs="*", metavar="RUN_ID_OR_DIR", help="run ids (in the data dir) or run directories")
    a("--all", action="store_true", help="replay every run of the data dir and print a summary")
    a("--data-dir", type=Path, help="where the runs are (env TRIPWIRE_DATA_DIR, default ~/.tripwire)")
    a("--config", type=Path, metavar="FILE", help="judge under this YAML's guard config instead")
    a("--json", action="store_true", help="print one JSON array of decisions")


def guard_configs_from_file(path: Path) -> dict[str, Any]:
    """The guard configs of a serve YAML: "" -> the project default, agent name -> its override."""
    from pydantic import ValidationError

    from proxy.guards.config import GuardConfig
    from proxy.settings import format_validation_error, yaml_source

    if not path.is_file():
        raise ConfigError(f"--config {path}: no such file")
    data = yaml_source(path)
    out: dict[str, Any] = {}
    try:
        out[""] = GuardConfig.model_validate(data.get("guards") or {})
        for name, body in (data.get("agents") or {}).items():
            out[str(name)] = GuardConfig.model_validate(body)
    except ValidationError as e:
        raise ConfigError(f"{path}: {format_validation_error(e, model=GuardConfig)}") from e
    return out


def run_replay(args: argparse.Namespace) -> int:
    import os

    from proxy import replay

    data_dir = args.data_dir or Path(os.environ.get("TRIPWIRE_DATA_DIR") or Path.home() / ".tripwire")
    data_dir = Path(data_dir).expanduser()
    if not args.runs and not args.all:
        print("tripwire replay: name runs (RUN_ID_OR_DIR ...) or --all", file=sys.stderr)
        return 2
    try:
        override = guard_configs_from_file(args.config) if args.config else None
    except ConfigError as e:
        print(f"tripwire replay: {e}", file=sys.stderr)
        return 2
    replays: list[replay.RunReplay] = []
    failed = 0
    for target in [str(d) for d in replay.all_runs(data_dir)] if args.all else args.runs:
        # each run on its own: one that cannot be read is named on stderr (one line), the others
        # are still replayed and printed, and the exit code says something was left out
        try:
            replays.append(replay.replay_dir(replay.resolve_run(target, data_dir), override))
        except replay.ReplayError as e:
            print(f"tripwire replay: {e}", file=sys.stderr)
            failed += 1
        except OSError as e:
            print(f"tripwire replay: {target}: cannot read: {e.strerror or e}", file=sys.stderr)
            failed += 1
    if args.json:
        sys.stdout.write(replay.as_json(replays).decode() + "\n")
        return 2 if failed else 0
    label = f"--config {args.config}" if args.config else "the recorded config"
    for r in replays:
        print(replay.as_text(r, label))
    if args.all:
        print(replay.summary(replays))
    return 2 if failed else 0
