"""MCP through Tripwire: JSON-RPC, the protocol adapter, result matching, legacy SSE, stdio servers."""
