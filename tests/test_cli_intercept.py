"""`tripwire intercept` in an environment without mitmproxy: a clear error, not a traceback."""

from __future__ import annotations

import importlib.util

import pytest

from proxy.cli import build_parser, main

needs_no_mitmproxy = pytest.mark.skipif(
    importlib.util.find_spec("mitmproxy") is not None, reason="mitmproxy is installed here"
)


@needs_no_mitmproxy
def test_intercept_without_mitmproxy_says_how_to_install_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["intercept", "--mode", "reverse:https://api.openai.com"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'tripwire[mitmproxy]'" in err
    assert "Traceback" not in err


def test_intercept_takes_the_serve_flags_too() -> None:
    args = build_parser().parse_args(
        [
            "intercept",
            "--listen-port",
            "9000",
            "--data-dir",
            "/tmp/x",
            "--agent",
            "a",
            "--llm",
            "anthropic=https://h",
        ]
    )
    assert (args.command, args.listen_port, args.mode, args.listen) == ("intercept", 9000, "regular", None)
    assert (args.data_dir, args.agent, args.llm) == ("/tmp/x", "a", [("anthropic", "https://h")])
    serve = build_parser().parse_args(["serve", "--data-dir", "/tmp/x"])
    assert serve.command == "serve" and serve.data_dir == "/tmp/x"
