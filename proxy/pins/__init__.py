"""Pinned MCP tool definitions (docs/mcp.md "Changed tools"): `definitions` and `decide` are pure
(what is pinned, how a list and a call are judged), `store` keeps pins (data dir or Redis),
`service` reads and writes them for the pipeline."""
