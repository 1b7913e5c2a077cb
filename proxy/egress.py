"""The way out to an upstream: `HTTP(S)_PROXY` / `NO_PROXY` and `~/.netrc`, read once.

aiohttp's `trust_env=True` reads the proxy variables and parses `~/.netrc` again for every request,
each time in a worker thread (two thread hops and a file parse per call: 13% of Tripwire's CPU under
load, docs/benchmarks.md). A process's environment does not change while it runs, so the same
answers, computed with aiohttp's own helpers, are taken once at start and kept per scheme and host:
- the proxy for the URL's scheme (`HTTP_PROXY`, `HTTPS_PROXY`), unless `NO_PROXY` exempts the host,
  with the proxy's credentials from its URL or from `~/.netrc`;
- the upstream host's own credentials from `~/.netrc`, when its URL carries none.

A changed `~/.netrc` or proxy variable is read at the next start.
"""

from __future__ import annotations

import netrc
from dataclasses import dataclass
from urllib.request import proxy_bypass

from aiohttp import BasicAuth
from yarl import URL

from proxy.aiohttp_compat import ProxyInfo, basicauth_from_netrc, netrc_from_env, proxies_from_env

_HOSTS_KEPT = 1024  # hosts come from configuration (and MCP legacy endpoints): few; bounded anyway


@dataclass(frozen=True)
class WayOut:
    """How a request to one scheme and host goes out: through `proxy` or not, with which credentials."""

    proxy: URL | None = None
    # the proxy's credentials (Proxy-Authorization): on the CONNECT of a TLS upstream, or on the
    # request itself when the proxy forwards plain HTTP (as aiohttp's proxy_auth does)
    proxy_headers: dict[str, str] | None = None
    headers: dict[str, str] | None = None
    auth: BasicAuth | None = None  # the host's own, from ~/.netrc


DIRECT = WayOut()


class Egress:
    def __init__(self) -> None:
        self._proxies: dict[str, ProxyInfo] = proxies_from_env()
        self._netrc: netrc.netrc | None = netrc_from_env()
        self._ways: dict[tuple[str, str], WayOut] = {}

    def way_out(self, url: URL) -> WayOut:
        key = (url.scheme, url.raw_host or "")
        found = self._ways.get(key)
        if found is None:
            if len(self._ways) >= _HOSTS_KEPT:
                self._ways.clear()
            found = self._ways[key] = self._resolve(url)
        if found.auth is not None and url.raw_user is not None:
            # credentials in the URL win over ~/.netrc, as in aiohttp
            return WayOut(found.proxy, found.proxy_headers, found.headers)
        return found

    def _resolve(self, url: URL) -> WayOut:
        host = url.host
        if not host:
            return DIRECT
        proxy = proxy_headers = headers = None
        info = self._proxies.get(url.scheme)
        if info is not None and not proxy_bypass(host):
            proxy = info.proxy
            if info.proxy_auth is not None:
                credentials = {"Proxy-Authorization": info.proxy_auth.encode()}
                if url.scheme in ("https", "wss"):
                    proxy_headers = credentials
                else:
                    headers = credentials
        auth = None
        if self._netrc is not None:
            try:
                auth = basicauth_from_netrc(self._netrc, host)
            except LookupError:
                auth = None
        if proxy is None and auth is None:
            return DIRECT
        return WayOut(proxy, proxy_headers, headers, auth)
