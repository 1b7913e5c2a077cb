"""`UpstreamRegistry` alone: configured upstreams by kind and name, and those registered at run
time (a stdio MCP child, a host the mitmproxy addon intercepts) taking precedence while they live."""

from __future__ import annotations

from pathlib import Path

from proxy.settings import Settings, UpstreamConfig
from proxy.upstreams import UpstreamRegistry


def registry(tmp_path: Path) -> UpstreamRegistry:
    settings = Settings.model_validate(
        {
            "data_dir": tmp_path,
            "upstream": {"url": "http://127.0.0.1:1/v1"},
            "llm": {"azure": {"url": "http://127.0.0.1:2"}},
            "mcp": {"demo": {"url": "http://127.0.0.1:3/mcp"}},
        }
    )
    return UpstreamRegistry(settings)


def test_configured_upstreams_by_kind_and_name(tmp_path: Path) -> None:
    reg = registry(tmp_path)
    assert reg.get("llm", "default").url == "http://127.0.0.1:1/v1"
    assert reg.get("llm", "azure").url == "http://127.0.0.1:2"
    assert reg.get("mcp", "demo").url == "http://127.0.0.1:3/mcp"
    assert reg.names("llm") == ("azure",)
    assert reg.names("mcp") == ("demo",)


def test_registered_upstreams_are_named_and_win_until_unregistered(tmp_path: Path) -> None:
    reg = registry(tmp_path)
    reg.register("mcp", "local", UpstreamConfig(url="http://127.0.0.1:4/mcp"))
    reg.register("llm", "default", UpstreamConfig(url="http://127.0.0.1:5/v1"))
    assert reg.names("mcp") == ("demo", "local")
    assert reg.get("mcp", "local").url == "http://127.0.0.1:4/mcp"
    assert reg.get("llm", "default").url == "http://127.0.0.1:5/v1"  # an intercepted host re-points it
    reg.unregister("mcp", "local")
    reg.unregister("llm", "default")
    assert reg.names("mcp") == ("demo",)
    assert reg.get("llm", "default").url == "http://127.0.0.1:1/v1"
