"""mitmproxy addon: the same Tripwire engine for agents that cannot change a base URL.

    mitmdump -s addons/tripwire_addon.py                       # forward proxy: HTTPS_PROXY + mitmproxy's CA
    mitmdump -s addons/tripwire_addon.py --mode reverse:https://api.openai.com

A thin adapter, one engine: on `running` it builds Tripwire's `Engine` from Tripwire's settings and
starts Tripwire's own proxy app on an internal 127.0.0.1 port inside mitmproxy's event loop. A flow to
an intercepted host (see `addons/hostmap.py`) is re-pointed at that app (`/llm/NAME/<original path>`),
whose upstream for NAME is the original host; every other flow passes untouched. So parsing, guards,
blocked answers and the recorder are literally the code `tripwire serve` runs. `done` drains in-flight
calls and closes open runs (RUN_END).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
from aiohttp import web
from mitmproxy import ctx, exceptions, http
from mitmproxy.proxy import mode_specs

from addons.hostmap import DEFAULT_HOSTS, Intercept, match, parse_host_map, with_reverse_target
from addons.identity import from_basic, identity_headers
from proxy.app import make_admin_app, make_proxy_app
from proxy.engine import Engine
from proxy.lifecycle import running_engine
from proxy.settings import ConfigError, Settings, UpstreamConfig, keyless, load_settings, split_host_port
from proxy.upstreams import Kind

log = logging.getLogger("tripwire.mitm")

OPTIONS = (
    "tripwire_config",
    "tripwire_data_dir",
    "tripwire_agent",
    "tripwire_listen",
    "tripwire_admin_listen",
)
STOPPING_ATTR = "tripwire_stopping"  # on ctx.master: the engine of an unloaded script, still closing
META_KEY = "tripwire"  # flow.metadata mark: the flow went through Tripwire (original URL, upstream)


class TripwireAddon:
    """One Tripwire engine behind mitmproxy; options are `--set tripwire_*=...`.

    `cli` and `config_file` are Tripwire's own settings sources (`tripwire intercept` passes its
    flags here); the `tripwire_*` options sit on top of them.
    """

    def __init__(
        self,
        cli: dict[str, Any] | None = None,
        config_file: Path | None = None,
        argv: list[str] | None = None,
    ) -> None:
        self.cli = dict(cli or {})
        self.config_file = config_file
        self.argv = argv
        self.settings: Settings | None = None
        self.error: str | None = None  # why Tripwire cannot run (config, start-up)
        self.intercepts: tuple[Intercept, ...] = ()
        self.engine: Engine | None = None
        self.base_url: str | None = None  # the internal Tripwire listener
        self.admin_url: str | None = None
        self._runners: list[web.AppRunner] = []
        self._lifecycle = contextlib.AsyncExitStack()  # the engine's running_engine, while it runs
        self._starting: asyncio.Task[None] | None = None
        self._closing: asyncio.Task[None] | None = None
        self._tunnels: dict[str, tuple[str, str | None]] = {}  # client connection id -> (agent, session)

    # --- mitmproxy lifecycle -----------------------------------------------------------------

    def load(self, loader: Any) -> None:
        loader.add_option(
            "tripwire_config", str, "", "Tripwire YAML config file (default .tripwire/config.yaml)."
        )
        loader.add_option(
            "tripwire_data_dir",
            str,
            "",
            "Where Tripwire writes runs (default TRIPWIRE_DATA_DIR or ~/.tripwire).",
        )
        loader.add_option(
            "tripwire_agent", str, "", "Agent name when a request names none (default 'default')."
        )
        loader.add_option(
            "tripwire_hosts",
            Sequence[str],
            list(DEFAULT_HOSTS),
            "Hosts whose calls go through Tripwire, as [SCHEME://]HOST[:PORT]=NAME (NAME: default, an LLM "
            "upstream name, or mcp:NAME). In reverse mode the target is the default upstream unless mapped.",
        )
        loader.add_option(
            "tripwire_listen", str, "127.0.0.1:0", "Tripwire's internal listener (port 0: any free port)."
        )
        loader.add_option(
            "tripwire_admin_listen",
            str,
            "",
            "Tripwire viewer/API/metrics listener (default: settings admin_listen, 127.0.0.1:8714); 'off' for none.",
        )

    def configure(self, updated: set[str]) -> None:
        """Before start, an error is logged (mitmproxy's errorcheck then exits, with no traceback);
        once running, a bad tripwire_hosts is refused like any bad mitmproxy option."""
        if self._starting is None:
            if updated & {*OPTIONS, "tripwire_hosts"}:
                self._load_settings()
        elif updated & set(OPTIONS):
            log.warning("tripwire options changed: restart mitmproxy to apply them")
        if updated & {"tripwire_hosts", "mode"}:
            try:
                self.intercepts = intercepts_for(ctx.options.tripwire_hosts, ctx.options.mode)
            except ValueError as e:
                if self._starting is not None:
                    raise exceptions.OptionsError(f"tripwire_hosts: {e}") from e
                self.error = f"tripwire_hosts: {e}"
                log.error(self.error)
            if self.engine is not None:  # hosts changed while running: the new map applies now
                for kind, name, upstream in self._upstreams(self.engine.settings):
                    self.engine.upstreams.register(kind, name, upstream)

    def running(self) -> asyncio.Task[None]:
        """Start Tripwire; also returned so mitmproxy awaits it (a reloaded script calls this sync)."""
        if self._starting is None:
            self._starting = asyncio.create_task(self._start(), name="tripwire-start")
        return self._starting

    def done(self) -> asyncio.Task[None] | None:
        """Drain and close runs; awaited on shutdown, scheduled when a script is unloaded."""
        if self._starting is None:
            return None
        if self._closing is None:
            self._closing = asyncio.create_task(self._stop(), name="tripwire-stop")
            # a reloaded script is a new module: its engine must wait until this one has closed its runs
            setattr(ctx.master, STOPPING_ATTR, self._closing)
        return self._closing

    # --- flows -------------------------------------------------------------------------------

    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or flow.request.path in ("", "*"):
            return
        if "upgrade" in flow.request.headers:  # WebSocket (e.g. Realtime): Tripwire does not relay it
            return
        entry = match(self.intercepts, flow.request.host, flow.request.port)
        if entry is None and flow.request.pretty_host != flow.request.host:
            # transparent and local modes: the host is an address, the Host header names the API
            entry = match(self.intercepts, flow.request.pretty_host, flow.request.port)
        if entry is None:
            return
        if self._starting is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._starting)
        if self.base_url is None or self.engine is None or self.engine.draining:
            flow.response = unavailable(self.error or "Tripwire is not running")
            return
        flow.metadata[META_KEY] = {"url": flow.request.url, "upstream": entry.url, "name": entry.name}
        credentials = proxy_credentials(flow) or self._tunnels.get(flow.client_conn.id)
        present = {name.lower() for name in flow.request.headers}
        for name, value in identity_headers(credentials, present).items():
            flow.request.headers[name] = value
        flow.request.url = self.base_url + entry.prefix + flow.request.path

    def http_connect(self, flow: http.HTTPFlow) -> None:
        """HTTPS_PROXY credentials come on the CONNECT only: keep them for the tunnel's requests."""
        credentials = proxy_credentials(flow)
        if credentials is not None:
            self._tunnels[flow.client_conn.id] = credentials

    def client_disconnected(self, client: Any) -> None:
        self._tunnels.pop(client.id, None)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        """Relay Tripwire's streams chunk by chunk; mitmproxy would otherwise buffer them whole."""
        if flow.response is None or META_KEY not in flow.metadata:
            return
        if flow.response.headers.get("content-type", "").lower().startswith("text/event-stream"):
            flow.response.stream = True

    # --- internals ---------------------------------------------------------------------------

    def _load_settings(self) -> None:
        overrides = dict(self.cli)
        opts = ctx.options
        if opts.tripwire_data_dir:
            overrides["data_dir"] = opts.tripwire_data_dir
        if opts.tripwire_agent:
            overrides["agent"] = opts.tripwire_agent
        config = Path(opts.tripwire_config).expanduser() if opts.tripwire_config else self.config_file
        try:
            self.settings = load_settings(overrides, config_file=config)
            self.error = None
        except ConfigError as e:
            self.settings, self.error = None, f"Tripwire configuration: {e}"
            log.error(self.error)

    def _upstreams(self, settings: Settings) -> list[tuple[Kind, str, UpstreamConfig]]:
        """Each intercepted host is an upstream of the engine; a configured key source is kept."""
        out: list[tuple[Kind, str, UpstreamConfig]] = []
        for entry in self.intercepts:
            configured = settings.upstreams(entry.kind).get(entry.name)
            if entry.kind == "llm" and entry.name == "default":
                configured = settings.upstream
            upstream = (
                configured.model_copy(update={"url": entry.url})
                if configured is not None
                else UpstreamConfig(url=entry.url)
            )
            out.append((entry.kind, entry.name, upstream))
        return out

    async def _start(self) -> None:
        previous = getattr(ctx.master, STOPPING_ATTR, None)
        if previous is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(previous)
        if self.settings is None and self.error is None:
            self._load_settings()
        if self.error is None:
            try:
                self.intercepts = intercepts_for(ctx.options.tripwire_hosts, ctx.options.mode)
            except ValueError as e:
                self.error = f"tripwire_hosts: {e}"
                log.error(self.error)
        if self.settings is not None and self.error is None and self.settings.auth.require_agent_key:
            # the agent's key (from the proxy credentials) is never forwarded: each intercepted host
            # needs its own key source, as `serve` requires of its upstreams (docs/gateway.md)
            missing = keyless([(f"{k}.{n}", u) for k, n, u in self._upstreams(self.settings)])
            if missing:
                self.error = (
                    "auth.require_agent_key: intercepted hosts need a key source (api_key_env or "
                    f"api_key_file under llm.NAME) or `api_key: none`; missing for {', '.join(missing)}"
                )
                log.error(self.error)
        if self.settings is None or self.error is not None:
            log.error("Tripwire cannot run; stopping mitmproxy")
            ctx.master.shutdown()
            return
        settings = self.settings
        try:
            engine = await self._lifecycle.enter_async_context(
                running_engine(
                    settings,
                    argv=self.argv if self.argv is not None else list(sys.argv),
                    upstreams=self._upstreams(settings),
                )
            )
            self.engine = engine
            host, port = split_host_port(ctx.options.tripwire_listen or "127.0.0.1:0")
            bound = await self._listen(make_proxy_app(engine), host, port, settings.drain_grace_s)
            self.base_url = f"http://{bound[0]}:{bound[1]}"
        except Exception as e:
            self.error = f"Tripwire could not start: {e}"
            log.error("%s; stopping mitmproxy", self.error)
            ctx.master.shutdown()
            return
        admin = ctx.options.tripwire_admin_listen or settings.admin_listen
        if admin != "off":
            try:
                ahost, aport = split_host_port(admin)
                abound = await self._listen(make_admin_app(engine), ahost, aport, 0)
                self.admin_url = f"http://{abound[0]}:{abound[1]}/"
            except (OSError, ValueError) as e:  # e.g. `tripwire serve` already has the port
                log.warning("Tripwire viewer not started on %s: %s", admin, e)
        log.info(startup_text(self.intercepts, engine, self.admin_url))
        hint = forward_hint(
            ctx.options.mode, ctx.options.listen_host, ctx.options.listen_port, ctx.options.confdir
        )
        if hint:
            log.info(hint)
        loop = proxy_loop(os.environ, ctx.options.listen_host, ctx.options.listen_port or 8080)
        if loop:
            log.warning(loop)

    async def _listen(self, app: web.Application, host: str, port: int, grace: float) -> tuple[str, int]:
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=grace)
        await runner.setup()
        self._runners.append(runner)
        await web.TCPSite(runner, host, port).start()
        address = runner.addresses[-1]
        return str(address[0]), int(address[1])

    async def _stop(self) -> None:
        if self._starting is not None:
            with contextlib.suppress(Exception):
                await self._starting
        engine = self.engine
        if engine is not None:
            await engine.drain(engine.settings.drain_grace_s)
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
        self.base_url = None
        await self._lifecycle.aclose()  # the children stop, the engine closes (proxy/lifecycle.py)
        self._lifecycle = contextlib.AsyncExitStack()
        self.engine = None


def intercepts_for(hosts: Sequence[str], modes: Sequence[str]) -> tuple[Intercept, ...]:
    """The host map, plus every reverse-mode target (the default upstream unless mapped)."""
    intercepts = parse_host_map(hosts)
    for spec in modes:
        mode = mode_specs.ProxyMode.parse(spec)
        if isinstance(mode, mode_specs.ReverseMode) and mode.scheme in ("http", "https"):
            intercepts = with_reverse_target(intercepts, mode.scheme, mode.address[0], mode.address[1])
    return intercepts


def proxy_credentials(flow: http.HTTPFlow) -> tuple[str, str | None] | None:
    """(agent, session) from the proxy credentials: mitmproxy's proxyauth result, else the header."""
    checked = flow.metadata.get("proxyauth")
    if isinstance(checked, tuple) and len(checked) == 2 and checked[0]:
        return str(checked[0]), str(checked[1]) or None
    return from_basic(flow.request.headers.get("Proxy-Authorization"))


def unavailable(reason: str) -> http.Response:
    """An intercepted call while Tripwire is down: refused, not sent unguarded."""
    body = {"error": {"message": reason, "type": "tripwire_unavailable", "code": "unavailable"}}
    return http.Response.make(
        503, orjson.dumps(body), {"Content-Type": "application/json", "Retry-After": "5"}
    )


def forward_hint(modes: Sequence[str], host: str, port: int | None, confdir: str) -> str | None:
    """What to set in the agent's environment for the forward-proxy mode."""
    if "regular" not in modes:
        return None
    shown = host if host not in ("", "0.0.0.0", "::") else "127.0.0.1"
    ca = Path(confdir).expanduser() / "mitmproxy-ca-cert.pem"
    return f"  export HTTPS_PROXY=http://{shown}:{port or 8080} SSL_CERT_FILE={ca}   (in the agent's environment)"


def proxy_loop(environ: Mapping[str, str], host: str, port: int) -> str | None:
    """Tripwire's own upstream calls honour HTTPS_PROXY: pointing it at this mitmproxy would loop."""
    ours = {"127.0.0.1", "localhost", "::1", "0.0.0.0", host.lower()} - {""}
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        value = environ.get(name, "")
        if not value:
            continue
        try:
            url = urlsplit(value if "://" in value else f"http://{value}")
            target = ((url.hostname or "").lower(), url.port)
        except ValueError:
            continue
        if target[0] in ours and target[1] == port:
            return (
                f"{name}={value} in mitmproxy's own environment: Tripwire's upstream calls would come back "
                "through this proxy; set it only in the agent's environment"
            )
    return None


def startup_text(intercepts: Sequence[Intercept], engine: Engine, admin_url: str | None) -> str:
    hosts = ", ".join(f"{i.url} -> {i.prefix}" for i in intercepts) or "nothing (set tripwire_hosts)"
    viewer = f"; viewer: {admin_url}" if admin_url else ""
    return f"Tripwire intercepting {hosts}; traces in {engine.data_dir}{viewer}"


addons = [TripwireAddon()]
