from proxy.routing import Route, RouteError, join_upstream, resolve

NAMES = {"default_agent": "default", "llm_names": ("anthropic",), "mcp_names": ("files",)}


def test_v1_goes_to_default_upstream_with_default_agent() -> None:
    r = resolve("/v1/chat/completions", {}, **NAMES)
    assert r == Route("llm", "default", "/v1/chat/completions", "default", None, "")


def test_agent_and_session_path_prefix() -> None:
    r = resolve("/agents/research-agent/sessions/s-42/v1/responses", {}, **NAMES)
    assert isinstance(r, Route)
    assert (r.agent, r.session, r.path, r.prefix) == (
        "research-agent",
        "s-42",
        "/v1/responses",
        "/agents/research-agent/sessions/s-42",
    )


def test_headers_win_over_path_identity() -> None:
    r = resolve("/agents/a/v1/models", {"X-Tripwire-Agent": "b", "X-Tripwire-Session": "x"}, **NAMES)
    assert isinstance(r, Route) and (r.agent, r.session) == ("b", "x")


def test_named_llm_and_mcp_routes() -> None:
    llm = resolve("/llm/anthropic/v1/messages", {}, **NAMES)
    assert isinstance(llm, Route) and (llm.kind, llm.upstream, llm.path) == (
        "llm",
        "anthropic",
        "/v1/messages",
    )
    mcp = resolve("/agents/a/mcp/files", {}, **NAMES)
    assert isinstance(mcp, Route) and (mcp.kind, mcp.upstream, mcp.path, mcp.prefix) == (
        "mcp",
        "files",
        "",
        "/agents/a/mcp/files",
    )
    sub = resolve("/mcp/files/messages/", {}, **NAMES)
    assert isinstance(sub, Route) and sub.path == "/messages/"


def test_unknown_names_list_the_configured_ones() -> None:
    r = resolve("/mcp/nope", {}, **NAMES)
    assert isinstance(r, RouteError) and r.status == 404 and r.known == ("files",) and "files" in r.message
    r = resolve("/llm/nope/v1/x", {}, **NAMES)
    assert isinstance(r, RouteError) and r.known == ("anthropic",)
    assert isinstance(resolve("/elsewhere", {}, **NAMES), RouteError)


def test_join_upstream_does_not_double_v1() -> None:
    assert join_upstream("https://api.openai.com", "/v1/models", "") == "https://api.openai.com/v1/models"
    assert join_upstream("https://h/v1/", "/v1/models", "a=1") == "https://h/v1/models?a=1"
    assert join_upstream("https://h/v1", "/v1beta/x", "") == "https://h/v1/v1beta/x"
    assert join_upstream("http://h/mcp", "", "") == "http://h/mcp"


def test_dot_segments_are_refused_even_percent_encoded() -> None:
    for path in (
        "/v1/%2e%2e/admin",
        "/v1/%2E%2e/x",
        "/llm/openai/./v1/models",
        "/mcp/files/../secret",
        "/v1/.%2e",
    ):
        r = resolve(path, {}, **NAMES)
        assert isinstance(r, RouteError) and r.status == 400, path
    assert isinstance(resolve("/v1/files/a..b", {}, **NAMES), Route)  # dots inside a segment are fine
