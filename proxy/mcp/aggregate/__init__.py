"""Several MCP servers behind one endpoint (SPEC §3): the aggregate server, its upstream sessions,
and the translations between MCP revisions."""
