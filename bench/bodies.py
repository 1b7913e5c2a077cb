"""Request bodies for the benchmark: the 800-byte prompt of the issue, and function-calling
histories as coding agents send them (a system prompt, tool definitions, then every step so far:
the assistant's tool call and the tool's result), resent whole on every call.
"""

from __future__ import annotations

from typing import Any

import orjson

MODEL = "gpt-4o-mini"

SMALL: dict[str, Any] = {
    "model": MODEL,
    "messages": [
        {"role": "system", "content": "You are a helpful assistant. " * 24},
        {"role": "user", "content": "Summarise the plot of a long novel in three sentences."},
    ],
}

SYSTEM = (
    "You are a coding agent working in a repository. Read files before editing them, run the tests "
    "after every change, and explain what you did in one short paragraph at the end. "
) * 12

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.replace('_', ' ')} in the working tree",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
    for name in ("read_file", "write_file", "list_dir", "run_tests", "grep")
]

# a tool result as agents get them: a piece of a source file (~330 bytes)
RESULT = (
    "def handler(request):\n    body = await request.read()\n    data = json.loads(body)\n"
    "    if not data.get('model'):\n        raise ValueError('model is required')\n"
    "    return await forward(data, timeout=30)\n\n# lines 40-46 of 312; the rest unchanged\n"
    "class Settings(BaseModel):\n    listen: str = '127.0.0.1:8713'\n    upstream: str\n"
)


def call_id(step: int) -> str:
    return f"call_{step:06d}"


def step_messages(step: int) -> list[dict[str, Any]]:
    """One agent step: the assistant asks for a tool, the tool answers."""
    cid = call_id(step)
    args = orjson.dumps({"path": f"src/module_{cid[-6:]}.py"}).decode()
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": cid, "type": "function", "function": {"name": "read_file", "arguments": args}}
            ],
        },
        {"role": "tool", "tool_call_id": cid, "content": f"{RESULT}# step {step}\n"},
    ]


def history(steps: int, task: str = "Fix the failing test in tests/test_app.py.") -> dict[str, Any]:
    """A function-calling conversation `steps` steps long (about 430 bytes a step)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": task},
    ]
    for step in range(steps):
        messages += step_messages(step)
    return {"model": MODEL, "messages": messages, "tools": TOOLS}


def encoded(body: dict[str, Any]) -> bytes:
    return orjson.dumps(body)
