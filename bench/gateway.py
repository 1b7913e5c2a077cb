"""The gateway phase's columns (docs/gateway.md): Tripwire with agent keys required, beside the same
Tripwire without, under the same c=32 load, so the difference is what the key check costs a call
(issue 22 acceptance 5). The key goes in `x-api-key` (the load's `Authorization` stays the bench's
provider key, which the check passes over), the upstream's own key comes from a key file.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from bench import procs
from proxy.agent_keys import FileKeyStore, RedisKeyStore


async def keys_column(
    name: str, up: int, base: Path, *, state_url: str | None = None
) -> tuple[procs.Target, str]:
    """`tripwire serve` with `auth.require_agent_key` and one agent key (its data dir under `base`,
    removed with the run's temporary dir): (the target, its key)."""
    data = base / name
    data.mkdir(parents=True)
    store = RedisKeyStore(state_url) if state_url else FileKeyStore(data)
    try:
        _, key = await store.create("bench")
    finally:
        await store.close()
    (data / "upstream-key").write_text("sk-bench-upstream\n")
    config = data / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "auth": {"require_agent_key": True},
                # the URL comes from serve's --upstream flag; the key source from here
                "upstream": {"url": f"http://127.0.0.1:{up}", "api_key_file": str(data / "upstream-key")},
            }
        )
    )
    extra = ["--config", str(config), "--data-dir", str(data)]
    if state_url:
        extra += ["--state", state_url]
    return await procs.tripwire(name, up, extra=tuple(extra)), key
