"""WebSocket pass-through (SPEC §4.2, §5.5): the Responses API over WebSocket, and any other socket.

An upgrade request on a proxied route (`GET` with `Upgrade: websocket`) is relayed with aiohttp's
own client and server WebSockets: Tripwire opens the upstream socket first (handler.py, with the
headers handshake.py makes), then the client's, then frames go both ways as they arrive (relay.py).
On a socket of a dialect whose calls come as `response.create` messages (the Responses API), each
such message is an LLM call through the LLM pipeline's stages (responses.py, stages.py, calls.py;
matching.py says which call an upstream event belongs to). Sockets on any other path
(`/v1/realtime`, `/mcp/NAME`, ...) are relayed, not recorded.
"""
