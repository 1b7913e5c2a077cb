"""per_tool, Loop Guard's graduated escalation: a tool's calls without progress since its last news reach
5/8/12 (idempotent) or 3/5/7 (mutating) -> warn/block/terminate; `per_tool_mode: count` counts every
call, as Loop Guard does. `classify_tool` says which kind a tool is.
"""

from __future__ import annotations

import re

from proxy.guards.config import LoopDetectionConfig
from proxy.guards.decision import Action
from proxy.guards.loop.pattern import MAX_EVIDENCE, Firing, Pattern
from proxy.guards.loop.turn import Attempt, Turn
from proxy.guards.signatures import normalize_tool_name

IDEMPOTENT_WORDS = (
    "read", "get", "list", "search", "status", "fetch", "query", "check", "find", "lookup", "view",
    "show", "describe", "inspect", "count", "test", "lint", "verify", "validate", "diff", "poll",
    "wait", "sleep", "ping", "health", "browse", "open", "load", "download", "scan",
)  # fmt: skip
MUTATING_WORDS = ("write", "edit", "delete", "execute", "shell", "commit", "push", "insert", "install")
# Well-known names the word heuristic would misplace (Loop Guard ships similar lists): read-only
# shell and git commands, and code runners whose names carry none of the words above.
KNOWN_IDEMPOTENT = frozenset(
    "grep glob ls cat head tail find pwd which whoami date git_log git_diff git_show git_branch"
    " git_status view describe help".split()
)
KNOWN_MUTATING = frozenset(
    "bash exec eval run_python run_command subprocess mkdir rm mv cp touch create_file move_file"
    " patch_file git_add git_reset git_checkout".split()
)


class PerTool(Pattern):
    KINDS = {"per_tool": "one tool was called too many times in this turn"}

    def judge(self, attempt: Attempt, turn: Turn, config: LoopDetectionConfig) -> Firing | None:
        tool = attempt.tool
        if config.per_tool_mode == "count":
            count, counted = turn.calls[tool], "called"
        elif attempt.presumed_stale or (not attempt.follows and not attempt.writes and turn.quiet(tool)):
            # new arguments of a tool whose latest answers learned nothing are presumed to learn
            # nothing either, until news (a page number that grows while the page stays the same)
            count, counted = turn.no_progress[tool] + 1, "called without progress"
        else:
            return None
        kind = classify_tool(tool, config)
        warn, block, halt = config.idempotent if kind == "idempotent" else config.mutating
        if count >= halt:
            action, limit = Action.TERMINATE, halt
        elif count >= block:
            action, limit = Action.BLOCK, block
        elif count >= warn:
            action, limit = Action.WARN, warn
        else:
            return None
        picked = [a.evidence for a in reversed(turn.attempts) if a.tool == tool and a.evidence]
        return Firing(
            "per_tool",
            ("per_tool", turn.number, tool, action),
            action,
            f"{kind} tool {tool} was {counted} {count} times in this turn",
            pattern=tool,
            threshold=limit,
            actual=count,
            repetitions=count,
            window_size=count,
            evidence=tuple(reversed(picked[:MAX_EVIDENCE])),
        )


def _words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w]


def _has_word(words: list[str], keys: tuple[str, ...]) -> bool:
    # a word that is a key or starts with one ("readfile", "searching"), never a substring
    # anywhere ("budget" is not "get", "credit" is not "edit")
    return any(w.startswith(k) for w in words for k in keys)


def classify_tool(name: str, config: LoopDetectionConfig) -> str:
    """Idempotent or mutating: the config's lists, well-known names, then the name's words.

    Mutating words win over idempotent ones (`read_then_write`); a name the heuristic cannot
    place is treated as mutating, as Loop Guard does (the stricter side for escalation counts).
    """
    bare = normalize_tool_name(name)
    if name in config.mutating_tools or bare in config.mutating_tools:
        return "mutating"
    if name in config.idempotent_tools or bare in config.idempotent_tools:
        return "idempotent"
    lowered = bare.lower()
    if lowered in KNOWN_MUTATING:
        return "mutating"
    if lowered in KNOWN_IDEMPOTENT:
        return "idempotent"
    words = _words(bare)
    if _has_word(words, MUTATING_WORDS):
        return "mutating"
    if _has_word(words, IDEMPOTENT_WORDS):
        return "idempotent"
    return "mutating"
