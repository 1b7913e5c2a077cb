#!/usr/bin/env bash
# Builds every environment the suite needs and runs all of it, plus lint. Used by .ci/run.
#   .venv        the main environment: tripwire[dev,browser] (mcp 2.x, openai, anthropic, playwright)
#   .venv-mcp1   mcp<2 (FastMCP, streamablehttp_client, legacy SSE), whose pins clash with mcp 2.x
#   .venv-mitm   mitmproxy, which pins its own dependencies tightly
#   .venv-lowest the lowest versions the runtime pins allow, for the lanes' tests
# Each pytest run must collect and pass tests: exit 5 (no tests) is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
QUIET=${QUIET:--q}

make_env() {
  local dir=$1; shift
  if [ ! -x "$dir/bin/python" ]; then "$PY" -m venv "$dir"; fi
  "$dir/bin/python" -m pip install $QUIET --disable-pip-version-check --upgrade pip >/dev/null
  "$dir/bin/python" -m pip install $QUIET --disable-pip-version-check "$@"
}

run_pytest() {
  local dir=$1; shift
  local rc=0
  "$dir/bin/python" -m pytest -p no:cacheprovider "$@" || rc=$?
  if [ "$rc" -eq 5 ]; then echo "error: $dir collected no tests for: $*" >&2; return 1; fi
  return "$rc"
}

ensure_chromium() {
  if [ -x /usr/bin/chromium ]; then return 0; fi
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  fi
}

ensure_redis() {
  # the shared guard-state tests (tests/test_state_*.py) start a real redis-server on loopback
  if command -v redis-server >/dev/null || [ -x /usr/bin/redis-server ]; then return 0; fi
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  fi
}

echo "== main environment"
make_env .venv -e ".[dev,browser]"
echo "== lint"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== typing"
.venv/bin/mypy
echo "== imports"
.venv/bin/lint-imports
ensure_chromium || echo "warning: chromium unavailable; browser tests will be skipped" >&2
ensure_redis || echo "warning: redis-server unavailable; shared-state tests will be skipped" >&2
echo "== tests (main)"
run_pytest .venv -m "not mcp1 and not mitm" "$@"

echo "== installed as a user installs it (pip install ., not editable)"
# the suite runs an editable install; a module missing from the distribution would only show here
make_env .venv-wheel .
.venv-wheel/bin/python -m pip install $QUIET --disable-pip-version-check --force-reinstall --no-deps . >/dev/null
(cd /tmp && "$OLDPWD/.venv-wheel/bin/python" -c "import proxy.app, proxy.replay, proxy.websocket, viewer.api; print('imports ok')")
.venv-wheel/bin/tripwire serve --help >/dev/null
.venv-wheel/bin/tripwire replay --help >/dev/null

echo "== lowest versions"
# the runtime pins' lowest bounds, exactly (scripts/lowest_constraints.py): the lanes, which lean on
# aiohttp's internals (proxy/aiohttp_compat.py) and on llhttp, must answer as aiohttp on all of them
make_env .venv-lowest -e ".[test]" \
  --constraint <(.venv/bin/python scripts/lowest_constraints.py)
run_pytest .venv-lowest tests/test_lean_http.py tests/test_upstream_http.py tests/test_upstream_differential.py "$@"

echo "== mcp<2 environment"
make_env .venv-mcp1 -e ".[test]" "mcp<2"
run_pytest .venv-mcp1 -m mcp1 "$@"

if [ -d addons ] && ls tests/test_mitm*.py >/dev/null 2>&1; then
  echo "== mitmproxy environment"
  # mitmproxy 11 (the last for Python 3.11) pins h11<=0.14, while genai-prices needs httpx2 -> h11>=0.16:
  # pip cannot resolve both in one go, so mitmproxy first, then Tripwire (h11 0.16 wins with a warning;
  # mitmproxy runs fine on it, see docs/mitmproxy.md).
  make_env .venv-mitm "mitmproxy>=11"
  make_env .venv-mitm -e ".[test]"
  run_pytest .venv-mitm -m mitm "$@"
fi
echo "== all test environments passed"
