"""Process settings and the static configuration sources.

Precedence, highest first (SPEC §5.4): CLI flags, `TRIPWIRE_*` environment variables, the
`--config` file or else the project YAML `.tripwire/config.yaml`, the user YAML
`~/.tripwire/config.yaml`, built-in defaults. Sources are merged key by key (a CLI flag overrides
one field, not a whole section); the guard sections are validated as one `GuardConfig` at the end,
and every error names the field and the source it came from.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import time
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from proxy.guards.config import GuardConfig, ServerPinsConfig

# the guard config's top-level keys (LangSight's sections, `shadow`, the gateway's and asking a
# person's keys: SPEC §5.4), accepted at the YAML's top level
GUARD_SECTIONS = tuple(GuardConfig.model_fields)
DEFAULT_UPSTREAM = "https://api.openai.com"


class ConfigError(ValueError):
    """A configuration source is invalid; the message names the field."""


# a key file's content, read again at most this often: a rotated Secret is picked up within a
# second (Kubernetes takes up to a minute to update the file anyway), and a call does not pay a
# file read (~40 us: open, read, close) for it
KEY_FILE_REREAD_S = 1.0
_key_files: dict[Path, tuple[float, str | None]] = {}


def read_key_file(path: Path, now: float | None = None) -> str | None:
    """The key in `path` (stripped; None when empty or unreadable), cached for `KEY_FILE_REREAD_S`."""
    now = time.monotonic() if now is None else now
    cached = _key_files.get(path)
    if cached is not None and now - cached[0] < KEY_FILE_REREAD_S:
        return cached[1]
    try:
        key = path.read_text().strip() or None
    except OSError:
        key = None
    _key_files[path] = (now, key)
    return key


class UpstreamConfig(BaseModel):
    """An upstream: its URL and, optionally, where its real API key comes from.

    With a key source the proxy replaces the agent's key with the upstream's own, so agents
    in a pod need no real key (SPEC §2).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str
    # an MCP server on /mcp: its own list_timeout_s (null: the top-level one)
    list_timeout_s: PositiveFloat | None = None
    api_key_env: str | None = None
    api_key_file: Path | None = None
    # Anthropic-style upstreams take the key in x-api-key; OpenAI-style in Authorization.
    auth_header: Literal["authorization", "x-api-key", "api-key"] = "authorization"
    # "none": this upstream takes no key (a local model, an open MCP server): with agent keys
    # required (SPEC §9) it needs no key source, and the agent's key headers are never sent to it
    api_key: Literal["none"] | None = None
    # an MCP server's own actions on changed tools (docs/mcp.md "Changed tools"; null: the agent's)
    tool_pins: ServerPinsConfig | None = None

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"must be an http(s) URL, got {v!r}")
        return v.rstrip("/")

    def read_api_key(self) -> str | None:
        """Read the key at call time, so a rotated Secret file is picked up without a restart."""
        if self.api_key_env:
            return os.environ.get(self.api_key_env) or None
        if self.api_key_file:
            return read_key_file(self.api_key_file)
        return None

    @property
    def has_key_source(self) -> bool:
        return bool(self.api_key_env or self.api_key_file)


class StdioServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    command: str
    env: dict[str, str] = Field(default_factory=dict)
    list_timeout_s: PositiveFloat | None = None  # on /mcp: its own (null: the top-level one)
    tool_pins: ServerPinsConfig | None = None  # its own actions on changed tools (null: the agent's)


class RetentionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    max_age_days: PositiveFloat | None = None
    max_total_mb: PositiveFloat | None = None


class StateConfig(BaseModel):
    """Where guard state lives (SPEC §8): in memory (no url, the embedded default) or a Redis that
    several replicas share, and what a call meets while that Redis is unreachable."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str | None = None
    # fail_open: forward, guard from local memory, report it; fail_closed: refuse (503, state_unavailable)
    on_unavailable: Literal["fail_open", "fail_closed"] = "fail_open"

    @field_validator("url")
    @classmethod
    def _redis_url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        return v


class AuthConfig(BaseModel):
    """Who may call the proxy listener (SPEC §9, docs/gateway.md): with `require_agent_key`, every
    call carries an agent key (`tripwire keys create`), which names its agent."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    require_agent_key: bool = False


class OtlpConfig(BaseModel):
    """Trace export over OTLP/HTTP (SPEC §8, docs/scaling.md), in addition to the local trace files."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # the collector's base URL (http://collector:4318) or its traces URL (.../v1/traces); None: no export
    endpoint: str | None = None
    # sent with every export, e.g. a hosted backend's key (OTEL_EXPORTER_OTLP_HEADERS works too)
    headers: dict[str, str] = Field(default_factory=dict)
    timeout_s: PositiveFloat = 10  # one export request, retries included; also bounds the flush at close
    export_interval_s: PositiveFloat = 2  # a batch leaves at least this often (or when 512 spans wait)
    max_queue: PositiveInt = 8192  # spans waiting for export; more are dropped (counted), never blocking

    @field_validator("endpoint")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError(f"must be an http(s) URL (OTLP/HTTP), got {v!r}")
        return v

    def traces_url(self) -> str | None:
        """The URL spans are POSTed to: a base URL gets OTLP's /v1/traces, as OTEL_EXPORTER_OTLP_ENDPOINT does."""
        if self.endpoint is None:
            return None
        base = self.endpoint.rstrip("/")
        return base if base.endswith("/v1/traces") else base + "/v1/traces"


class Settings(BaseModel):
    """Everything `tripwire serve` needs. Frozen: built once at start, validated as a whole."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    listen: str = "127.0.0.1:8713"
    admin_listen: str = "127.0.0.1:8714"
    upstream: UpstreamConfig = UpstreamConfig(url=DEFAULT_UPSTREAM)
    llm: dict[str, UpstreamConfig] = Field(default_factory=dict)
    mcp: dict[str, UpstreamConfig] = Field(default_factory=dict)
    mcp_stdio: dict[str, StdioServerConfig] = Field(default_factory=dict)
    # the aggregate endpoint `/mcp` (SPEC §3, docs/mcp.md): which servers it serves (null: every
    # `mcp` and `mcp_stdio` server; [] turns it off), and how long each server's own listing may take
    # before that server drops out of the merged list
    mcp_aggregate: tuple[str, ...] | None = None
    list_timeout_s: PositiveFloat = 5
    agent: str = "default"
    data_dir: Path = Path("~/.tripwire")
    admin_token: str | None = None

    @field_validator("admin_token")
    @classmethod
    def _token_not_blank(cls, value: str | None) -> str | None:
        # a blank token would lock everyone out (no client sends a blank bearer) while looking set
        if value is not None and not value.strip():
            raise ValueError(
                "must not be empty or only whitespace (unset it to run without a token on loopback)"
            )
        return value

    session_idle_timeout_s: PositiveFloat = 300
    terminated_ttl_s: PositiveFloat = 24 * 3600
    connect_timeout_s: PositiveFloat = 10
    ttfb_timeout_s: PositiveFloat = 600
    # the agent's side: a connection that has not sent a whole request head (or sits idle between
    # keep-alive requests) this long is closed; a body that sends no byte this long gets a 408
    header_timeout_s: PositiveFloat = 60
    body_idle_timeout_s: PositiveFloat = 60
    max_body_bytes: PositiveInt = 32 * 1024 * 1024
    # relayed WebSockets (proxy/socket_limits.py, docs/configuration.md): closed after this long
    # without a message either way (null: never), and at most this many open per agent (null: no cap)
    websocket_idle_timeout_s: PositiveFloat | None = 900
    websocket_max_per_agent: PositiveInt | None = 32
    # a compressed answer is decoded for the trace up to this many bytes (docs/configuration.md)
    max_decoded_bytes: PositiveInt = 16 * 1024 * 1024
    # uvloop (a dependency on Linux and macOS) runs the proxy's event loop; "asyncio" picks the
    # standard library's, and it is used anyway where uvloop is not installed (docs/benchmarks.md)
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    drain_grace_s: float = Field(20, ge=0)
    ca_bundle: Path | None = None

    # trace store
    max_field_bytes: PositiveInt = 20000
    record_content: bool = True
    record_full_prompts: bool = False
    fsync: Literal["never", "run_end", "always"] = "run_end"
    # where the trace's files are written: a child process with its own GIL, or the event loop
    # (docs/trace-format.md "Writing, flushing and fsync")
    trace_writer: Literal["process", "loop"] = "loop"
    retention: RetentionConfig = RetentionConfig()

    # gateway (SPEC §9): agent keys
    auth: AuthConfig = AuthConfig()
    # a call Tripwire cannot classify (an unknown POST on an LLM route, a WebSocket without a dialect,
    # a tools/call in a batch or without an id) is refused whenever policy applies to the agent;
    # true relays it unjudged as before (docs/gateway.md "Fail closed")
    passthrough_unknown: bool = False

    # scale-out (SPEC §8): shared guard state, trace export
    state: StateConfig = StateConfig()
    otlp: OtlpConfig = OtlpConfig()

    # pricing: model -> [input_per_1m_usd, output_per_1m_usd]
    pricing_table: dict[str, tuple[float, float]] = Field(default_factory=dict)

    # guards: the project default and whole-object agent overrides
    guards: GuardConfig = GuardConfig()
    agents: dict[str, GuardConfig] = Field(default_factory=dict)
    expose_guard_details: bool = True
    alert_webhook: str | None = None
    # opt-in recoveries (SPEC §5.4 "Other settings"), off by default:
    # resend a call after a connection error, 502 or 503 this many times (jittered exponential
    # back-off from upstream_retry_base_s), before anything reached the client and before the
    # circuit breaker counts a failure
    upstream_retries: int = Field(0, ge=0, le=10)
    upstream_retry_base_s: PositiveFloat = 0.5
    # continue a non-streamed Chat Completions answer cut off at its token limit
    # (finish_reason "length") up to this many times; the agent gets one stitched answer
    max_tokens_recovery: int = Field(0, ge=0, le=10)

    @field_validator("listen", "admin_listen")
    @classmethod
    def _host_port(cls, v: str) -> str:
        split_host_port(v)
        return v

    @model_validator(mode="after")
    def _gateway_upstreams_have_keys(self) -> Settings:
        """With agent keys required the agent's key is never forwarded: every upstream needs its own
        key source, or `api_key: none` to say it takes none (SPEC §9)."""
        if not self.auth.require_agent_key:
            return self
        named = [("upstream", self.upstream)]
        named += [(f"llm.{n}", u) for n, u in self.llm.items()]
        named += [(f"mcp.{n}", u) for n, u in self.mcp.items()]
        missing = keyless(named)
        if missing:
            raise ValueError(
                "auth.require_agent_key: the agent's key is never forwarded, so every upstream needs "
                "a key source (api_key_env or api_key_file) or `api_key: none`; missing for "
                + ", ".join(missing)
            )
        return self

    def viewer_run_url(self, run_id: str) -> str:
        """A run's page in the viewer, on the admin listener."""
        host, port = split_host_port(self.admin_listen)
        return f"http://{url_host(host)}:{port}/?run={run_id}"

    def resolved_data_dir(self) -> Path:
        return self.data_dir.expanduser().resolve()

    def upstreams(self, kind: Literal["llm", "mcp"]) -> dict[str, UpstreamConfig]:
        return dict(self.llm) if kind == "llm" else dict(self.mcp)


def keyless(named: list[tuple[str, UpstreamConfig]]) -> list[str]:
    """The names of upstreams with neither a key source nor `api_key: none` (agent keys refuse them)."""
    return [name for name, u in named if not u.has_key_source and u.api_key != "none"]


def split_host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not (0 <= int(port) <= 65535):
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def url_host(host: str) -> str:
    """The host as it goes in a URL: a wildcard bind is reached on loopback; IPv6 in brackets."""
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ---- sources -----------------------------------------------------------------------------------

# Scalar settings readable from the environment: TRIPWIRE_<NAME>.
ENV_FIELDS = (
    "listen",
    "admin_listen",
    "agent",
    "data_dir",
    "admin_token",
    "session_idle_timeout_s",
    "terminated_ttl_s",
    "connect_timeout_s",
    "ttfb_timeout_s",
    "max_body_bytes",
    "websocket_idle_timeout_s",
    "websocket_max_per_agent",
    "max_decoded_bytes",
    "event_loop",
    "drain_grace_s",
    "ca_bundle",
    "max_field_bytes",
    "record_content",
    "record_full_prompts",
    "fsync",
    "trace_writer",
    "expose_guard_details",
    "alert_webhook",
    "upstream_retries",
    "upstream_retry_base_s",
    "max_tokens_recovery",
    "list_timeout_s",
    "passthrough_unknown",
)
# Friendlier aliases documented in the README.
ENV_ALIASES = {"TRIPWIRE_UPSTREAM": "upstream", "TRIPWIRE_SESSION_IDLE_TIMEOUT": "session_idle_timeout_s"}
# Fields of a section: a Redis URL may hold a password, so a Kubernetes Secret can provide it as env.
ENV_NESTED = {
    "TRIPWIRE_STATE_URL": ("state", "url"),
    "TRIPWIRE_STATE_ON_UNAVAILABLE": ("state", "on_unavailable"),
    "TRIPWIRE_OTLP_ENDPOINT": ("otlp", "endpoint"),
    "TRIPWIRE_AUTH_REQUIRE_AGENT_KEY": ("auth", "require_agent_key"),
}


def env_source(environ: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ENV_FIELDS:
        key = f"TRIPWIRE_{name.upper()}"
        if key in environ:
            out[name] = environ[key]
    for key, name in ENV_ALIASES.items():
        if key in environ:
            out[name] = environ[key]
    for key, (section, name) in ENV_NESTED.items():
        if key in environ:
            out.setdefault(section, {})[name] = environ[key]
    return out


def yaml_source(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(yaml_error_line(path, e)) from e
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return normalise_file(data)


def yaml_error_line(path: Path, e: yaml.YAMLError) -> str:
    """One line: `file:line:column: not valid YAML: what was expected` (PyYAML's own text spans
    several lines and names the input "<unicode string>")."""
    if not isinstance(e, yaml.MarkedYAMLError) or e.problem_mark is None:
        return f"{path}: not valid YAML: {' '.join(str(e).split())}"
    mark = e.problem_mark
    text = f"{path}:{mark.line + 1}:{mark.column + 1}: not valid YAML: {e.problem}"
    if e.context:
        started = e.context_mark
        where = f" at {started.line + 1}:{started.column + 1}" if started is not None else ""
        text += f" ({e.context}{where})"
    return text


def normalise_file(data: dict[str, Any]) -> dict[str, Any]:
    """Accept the LangSight shape: guard sections at the top level form the project default."""
    data = dict(data)
    guards = dict(data.pop("guards", None) or {})
    for section in GUARD_SECTIONS:
        if section in data:
            guards[section] = data.pop(section)
    if guards:
        data["guards"] = guards
    if isinstance(data.get("upstream"), str):
        data["upstream"] = {"url": data["upstream"]}
    for kind in ("llm", "mcp"):
        if isinstance(data.get(kind), dict):
            data[kind] = {k: ({"url": v} if isinstance(v, str) else v) for k, v in data[kind].items()}
    if isinstance(data.get("mcp_stdio"), dict):
        data["mcp_stdio"] = {
            k: ({"command": v} if isinstance(v, str) else v) for k, v in data["mcp_stdio"].items()
        }
    return data


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def load_settings(
    cli: dict[str, Any],
    *,
    config_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    home: Path | None = None,
) -> Settings:
    """Merge every static source and validate once; raise ConfigError naming the bad field."""
    environ = os.environ if environ is None else environ
    cwd = cwd or Path.cwd()
    home = home or Path.home()
    layers: list[tuple[str, dict[str, Any]]] = []
    user_file = home / ".tripwire" / "config.yaml"
    if user_file.is_file():
        layers.append((str(user_file), yaml_source(user_file)))
    project_file = config_file or (cwd / ".tripwire" / "config.yaml")
    if config_file is not None and not config_file.is_file():
        raise ConfigError(f"--config {config_file}: no such file")
    if project_file.is_file():
        layers.append((str(project_file), yaml_source(project_file)))
    layers.append(("environment", normalise_file(env_source(environ))))
    layers.append(("command line", normalise_file(cli)))

    merged: dict[str, Any] = {}
    for _, layer in layers:
        merged = deep_merge(merged, layer)
    try:
        return Settings.model_validate(merged)
    except ValidationError as e:
        used = [(name, layer) for name, layer in layers if layer]  # an empty source set nothing
        raise ConfigError(format_validation_error(e, sources=used)) from e


def format_validation_error(
    e: ValidationError,
    sources: list[tuple[str, dict[str, Any]]] | None = None,
    model: type[BaseModel] | None = None,
) -> str:
    """Every error on one line naming the field; an unknown key gets the nearest known one
    ("loop_detecton: unknown key; did you mean loop_detection?"); with several `sources` (name,
    what it set), each line starts with the one that set the field."""
    root = model or Settings
    lines = []
    for err in e.errors():
        loc = tuple(err["loc"])
        field = ".".join(str(p) for p in loc) or "(top level)"
        if err["type"] == "extra_forbidden" and loc:
            line = f"{field}: unknown key{_suggestion(str(loc[-1]), known_keys(root, loc[:-1]))}"
        else:
            line = f"{field}: {err['msg'].removeprefix('Value error, ')}"
        if sources and len(sources) > 1:
            origin = next((name for name, layer in reversed(sources) if _sets(layer, loc)), None)
            if origin is not None:
                line = f"{origin}: {line}"
        lines.append(line)
    where = f" (sources: {', '.join(name for name, _ in sources)})" if sources else ""
    return "invalid configuration" + where + ":\n  " + "\n  ".join(lines)


def known_keys(model: type[BaseModel], path: tuple[Any, ...]) -> list[str]:
    """The keys the model accepts at `path` (a dict's keys in the path are skipped); [] if unknown."""
    current: Any = model
    for part in path:
        current = _field_type(current, part)
        if current is None:
            return []
    if not (isinstance(current, type) and issubclass(current, BaseModel)):
        return []
    keys = list(current.model_fields)
    if current is Settings:
        keys += GUARD_SECTIONS  # accepted at the top level, the LangSight shape
    return keys


def _field_type(current: Any, part: Any) -> Any:
    """The type one step into `current` (a model's field, or a dict's value type)."""
    if isinstance(current, type) and issubclass(current, BaseModel):
        info = current.model_fields.get(str(part))
        return None if info is None else _unwrap(info.annotation)
    if get_origin(current) is dict:
        return _unwrap(get_args(current)[1])
    return None


def _unwrap(annotation: Any) -> Any:
    """`X | None` -> X (the one model among a union's members, if there is one)."""
    if get_origin(annotation) in (Union, types.UnionType):
        members = [a for a in get_args(annotation) if a is not type(None)]
        if len(members) == 1:
            return _unwrap(members[0])
    return annotation


def _suggestion(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    if close:
        return f"; did you mean {close[0]}?"
    return f" (known: {', '.join(sorted(known))})" if known else ""


def _sets(layer: Mapping[str, Any], loc: tuple[Any, ...]) -> bool:
    node: Any = layer
    for part in loc:
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True
