from pathlib import Path

import pytest

from proxy.cli import build_parser, check_startup, cli_overrides
from proxy.settings import ConfigError, load_settings


def load(tmp_path: Path, cli: dict | None = None, env: dict | None = None, **kw):
    return load_settings(cli or {}, environ=env or {}, cwd=tmp_path / "proj", home=tmp_path / "home", **kw)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_defaults(tmp_path: Path) -> None:
    s = load(tmp_path)
    assert s.listen == "127.0.0.1:8713" and s.admin_listen == "127.0.0.1:8714"
    assert s.upstream.url == "https://api.openai.com"
    assert s.guards.loop_detection.threshold == 5 and s.guards.circuit_breaker.open_after_failures == 5
    assert s.connect_timeout_s == 10 and s.ttfb_timeout_s == 600 and s.max_body_bytes == 32 * 1024 * 1024


def test_precedence_cli_env_project_user(tmp_path: Path) -> None:
    write(
        tmp_path / "home/.tripwire/config.yaml",
        "agent: from-user\nlisten: 127.0.0.1:1\nadmin_listen: 127.0.0.1:2\nfsync: always\n",
    )
    write(
        tmp_path / "proj/.tripwire/config.yaml",
        "agent: from-project\nlisten: 127.0.0.1:3\nloop_detection: {threshold: 7}\n",
    )
    s = load(tmp_path, cli={"agent": "from-cli"}, env={"TRIPWIRE_LISTEN": "127.0.0.1:4"})
    assert s.agent == "from-cli"
    assert s.listen == "127.0.0.1:4"
    assert s.admin_listen == "127.0.0.1:2"
    assert s.fsync == "always"
    assert s.guards.loop_detection.threshold == 7
    assert s.guards.loop_detection.action == "warn"


def test_config_file_flag_replaces_project_file(tmp_path: Path) -> None:
    write(tmp_path / "proj/.tripwire/config.yaml", "agent: from-project\n")
    f = write(
        tmp_path / "elsewhere.yaml",
        "agent: from-flag\nllm: {anthropic: 'http://127.0.0.1:9'}\nmcp_stdio: {echo: 'python -m x'}\n",
    )
    s = load(tmp_path, config_file=f)
    assert s.agent == "from-flag"
    assert s.llm["anthropic"].url == "http://127.0.0.1:9"
    assert s.mcp_stdio["echo"].command == "python -m x"


def test_invalid_values_name_the_field(tmp_path: Path) -> None:
    write(tmp_path / "proj/.tripwire/config.yaml", "budget: {max_cost_usd: 1, soft_alert_threshold_usd: 2}\n")
    with pytest.raises(ConfigError, match="soft_alert_threshold_usd"):
        load(tmp_path)
    with pytest.raises(ConfigError, match="loop_detection.threshold"):
        load(tmp_path / "x", cli={"loop_detection": {"threshold": "many"}})
    with pytest.raises(ConfigError, match="listen"):
        load(tmp_path / "y", env={"TRIPWIRE_LISTEN": "nope"})
    with pytest.raises(ConfigError, match="not valid YAML"):
        write(tmp_path / "z/proj/.tripwire/config.yaml", "a: [\n")
        load(tmp_path / "z")


def test_invalid_yaml_is_one_line_with_file_line_and_column(tmp_path: Path) -> None:
    f = write(tmp_path / "proj/.tripwire/config.yaml", "budget:\n  max_cost_usd: [1\nlimits: {}\n")
    with pytest.raises(ConfigError) as caught:
        load(tmp_path)
    assert str(caught.value) == (
        f"{f}:3:7: not valid YAML: expected ',' or ']', but got ':' (while parsing a flow sequence at 2:17)"
    )


def test_an_unknown_key_gets_the_nearest_known_one(tmp_path: Path) -> None:
    f = write(
        tmp_path / "proj/.tripwire/config.yaml",
        "loop_detecton: {threshold: 4}\nlimits: {max_llm_call: 3}\nllm: {a: {url: 'http://x', api_key_envv: K}}\n",
    )
    with pytest.raises(ConfigError) as caught:
        load(tmp_path)  # the environment and the command line set nothing: not listed
    assert str(caught.value) == (
        f"invalid configuration (sources: {f}):\n"
        "  llm.a.api_key_envv: unknown key; did you mean api_key_env?\n"
        "  guards.limits.max_llm_call: unknown key; did you mean max_llm_calls?\n"
        "  loop_detecton: unknown key; did you mean loop_detection?"
    )


def test_with_several_sources_each_error_names_its_own(tmp_path: Path) -> None:
    f = write(tmp_path / "proj/.tripwire/config.yaml", "budget: {max_cost_usd: 1}\nfsync: sometimes\n")
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, cli={"agent": "a"}, env={"TRIPWIRE_LISTEN": "nope"})
    assert str(caught.value) == (
        f"invalid configuration (sources: {f}, environment, command line):\n"
        "  environment: listen: expected HOST:PORT, got 'nope'\n"
        f"  {f}: fsync: Input should be 'never', 'run_end' or 'always'"
    )


def test_cli_flags_map_to_settings(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "--listen",
            "127.0.0.1:9000",
            "--llm",
            "anthropic=http://127.0.0.1:1",
            "--mcp",
            "files=http://127.0.0.1:2/mcp",
            "--agent",
            "bot",
            "--session-idle-timeout",
            "5",
            "--no-record-content",
        ]
    )
    s = load(tmp_path, cli=cli_overrides(args))
    assert s.listen == "127.0.0.1:9000" and s.agent == "bot" and s.session_idle_timeout_s == 5
    assert s.llm["anthropic"].url == "http://127.0.0.1:1" and s.mcp["files"].url == "http://127.0.0.1:2/mcp"
    assert s.record_content is False


def test_admin_off_loopback_needs_a_token(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="admin-token"):
        check_startup(load(tmp_path, cli={"admin_listen": "0.0.0.0:8714"}))
    check_startup(load(tmp_path, cli={"admin_listen": "0.0.0.0:8714", "admin_token": "t"}))
    check_startup(load(tmp_path))


def test_upstream_key_from_env_and_file(tmp_path: Path) -> None:
    key_file = write(tmp_path / "key", "sk-from-file\n")
    s = load(
        tmp_path,
        cli={
            "llm": {
                "a": {"url": "http://127.0.0.1:1", "api_key_env": "K"},
                "b": {"url": "http://127.0.0.1:1", "api_key_file": str(key_file)},
            }
        },
    )
    import os

    os.environ["K"] = "sk-from-env"
    try:
        assert s.llm["a"].read_api_key() == "sk-from-env"
    finally:
        del os.environ["K"]
    assert s.llm["b"].read_api_key() == "sk-from-file"


def test_a_rotated_key_file_is_read_again_after_a_second(tmp_path: Path) -> None:
    from proxy.settings import KEY_FILE_REREAD_S, read_key_file

    key_file = tmp_path / "key"
    key_file.write_text("sk-old\n")
    assert read_key_file(key_file, now=100.0) == "sk-old"
    key_file.write_text("sk-new\n")
    assert read_key_file(key_file, now=100.0 + KEY_FILE_REREAD_S / 2) == "sk-old"  # no read per call
    assert read_key_file(key_file, now=100.0 + KEY_FILE_REREAD_S) == "sk-new"
    key_file.unlink()
    assert read_key_file(key_file, now=102.0 + KEY_FILE_REREAD_S) is None


def test_a_blank_admin_token_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="admin_token: .*empty or only whitespace"):
        load_settings({"admin_token": "  "}, environ={}, cwd=tmp_path, home=tmp_path)


def test_scale_out_settings_from_flags_env_and_file(tmp_path: Path) -> None:
    """SPEC §8: --state URL / state: {url, on_unavailable}; --otlp-endpoint URL / otlp: {endpoint}."""
    s = load(tmp_path)
    assert s.state.url is None and s.state.on_unavailable == "fail_open"
    assert s.otlp.endpoint is None and s.otlp.traces_url() is None
    args = build_parser().parse_args(
        ["serve", "--state", "redis://redis:6379/0", "--otlp-endpoint", "http://collector:4318"]
    )
    s = load(tmp_path, cli=cli_overrides(args))
    assert s.state.url == "redis://redis:6379/0"
    assert s.otlp.traces_url() == "http://collector:4318/v1/traces"
    # a Secret can give the Redis URL (it may hold a password) as env; the file sets the rest
    write(
        tmp_path / "f/proj/.tripwire/config.yaml",
        "state: {on_unavailable: fail_closed}\notlp: {timeout_s: 3}\n",
    )
    s = load(
        tmp_path / "f",
        env={
            "TRIPWIRE_STATE_URL": "rediss://:pw@redis:6380/1",
            "TRIPWIRE_OTLP_ENDPOINT": "https://otlp.example.com/v1/traces",
        },
    )
    assert (s.state.url, s.state.on_unavailable) == ("rediss://:pw@redis:6380/1", "fail_closed")
    assert s.otlp.traces_url() == "https://otlp.example.com/v1/traces" and s.otlp.timeout_s == 3


@pytest.mark.parametrize(
    ("cli", "field"),
    [
        ({"state": {"url": "http://redis:6379"}}, "state.url"),
        ({"state": {"on_unavailable": "retry"}}, "state.on_unavailable"),
        ({"otlp": {"endpoint": "collector:4317"}}, "otlp.endpoint"),
        ({"otlp": {"endpoint": "http://c:4318", "max_queue": 0}}, "otlp.max_queue"),
    ],
)
def test_scale_out_settings_are_validated(tmp_path: Path, cli: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load(tmp_path, cli=cli)


def test_otlp_without_the_extra_is_refused_at_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec

    def without_otlp(name: str, *a: object, **kw: object) -> object:
        return None if name.startswith("opentelemetry.exporter") else real(name, *a, **kw)  # type: ignore[arg-type]

    settings = load(tmp_path, cli={"otlp": {"endpoint": "http://127.0.0.1:4318"}})
    check_startup(settings)  # installed here (the dev extra)
    monkeypatch.setattr(importlib.util, "find_spec", without_otlp)
    with pytest.raises(ConfigError, match=r"pip install 'tripwire\[otlp\]'"):
        check_startup(settings)
    check_startup(load(tmp_path))  # no endpoint, no need


def test_the_gateway_guard_keys_are_accepted_at_the_top_level(tmp_path: Path) -> None:
    """SPEC §5.4 puts `tools` (and the other gateway keys) beside `loop_detection`."""
    write(
        tmp_path / "proj/.tripwire/config.yaml",
        "tools: {allow: ['read_*'], deny: [shell]}\nagents: {bot: {tools: {deny: ['*']}}}\n",
    )
    s = load(tmp_path)
    assert s.guards.tools.allow == ("read_*",) and s.guards.tools.deny == ("shell",)
    assert s.agents["bot"].tools.deny == ("*",)
