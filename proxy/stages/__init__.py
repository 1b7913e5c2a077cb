"""The pipeline stages, one per module (their order: proxy/pipelines.py).

`llm_parse`, `mcp_parse`: what the call is; `session`: its run; `responses_chain`: what a
`previous_response_id` stands for; `tool_results`: the TOOL_CALLs of the results a request brings;
`guards`: the guards' decisions (state where `GuardBackend` keeps it); `breaker`: the circuit;
`recovery`: max-tokens continuation (opt-in); `forward`: the upstream call; `record`: its events.
"""
