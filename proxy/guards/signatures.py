"""Canonical tool-call signatures (SPEC §5.1): the identity loop detection compares.

A model can dodge an exact-match loop detector by nudging a float (`1.0`, `0.9999999`) or by
reordering keys, and OpenAI sends arguments as a JSON *string* while MCP sends an object; so
arguments are parsed, keys sorted and floats rounded to 6 decimals before they are compared.
Integers, booleans, strings and null are left exactly as they are.

Arguments may nest thousands of levels deep (a model's JSON string, MCP arguments): every walk
here uses an explicit stack, never recursion, so a deep call is judged like any other (SPEC §4.2).
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, NamedTuple

import orjson

from proxy import jsonparse
from proxy.guards import structure
from proxy.guards.tree import rebuild
from proxy.guards.volatile import fold_text, result_slots, stable_text, stable_value

FLOAT_DIGITS = 6


def normalize_tool_name(name: str) -> str:
    """The bare tool name: frameworks prefix MCP tools as `server__tool` (or `mcp__server__tool`).

    The part after the last `__` is the tool the MCP server knows, so a call seen once as an MCP
    `tools/call` of `search` and once in the LLM history as `docs__search` is one call.
    """
    head, sep, tail = name.rpartition("__")
    if sep and head and tail:
        return tail
    return name


def _canonical_scalar(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, int | str):
        return value
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return repr(value)  # not JSON; keep it comparable
        rounded = round(value, FLOAT_DIGITS)
        return 0.0 if rounded == 0 else rounded  # -0.0 and 0.0 are the same argument
    return str(value)


def canonical_value(value: Any) -> Any:
    """At every depth: dict keys as str, floats rounded, tuples as lists; everything else unchanged.

    Iterative (`proxy.guards.tree.rebuild`), so any depth is fine.
    """
    return rebuild(value, _canonical_scalar)


def _parse_if_json(args: Any) -> Any:
    if isinstance(args, bytes | bytearray):
        args = args.decode("utf-8", "replace")
    if isinstance(args, str):
        text = args.strip()
        if not text:
            return {}
        try:
            return jsonparse.loads(text)
        except ValueError:
            return args  # a raw string argument: compared as it is
    return args


def canonical_args(args: Any) -> str:
    """Canonical JSON of a call's arguments: `{}` for none, keys sorted, floats rounded."""
    parsed = _parse_if_json(args)
    if parsed is None:
        parsed = {}
    return _dumps(canonical_value(parsed))


def _dumps(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        # what orjson refuses (ints beyond 64 bits, nesting deeper than 254, lone surrogates):
        # json.dumps(sort_keys=True, compact, ensure_ascii=False)'s text, written iteratively
        return jsonparse.dumps_text(value, sort_keys=True)


def signature(tool: str, args: Any) -> str:
    """`tool(<canonical args>)` with the tool name normalised: the unit every loop pattern counts."""
    return f"{normalize_tool_name(tool)}({canonical_args(args)})"


def stable_signature(tool: str, args: Any) -> str:
    """The call's identity for progress: its signature without per-call noise (`volatile`).

    A fresh `request_id`, a timestamp or a nonce does not make a call new, and short strings are
    compared case- and space-folded ("Weather in Paris?" is "weather in paris").
    """
    return _identity(tool, args)[0]


# between an identity and the digests of the values its arguments name (`structure.argument_values`):
# live, after the stable signature (JSON never holds a raw control character); recorded, after its hash
FOLLOWS_LIVE = "\x1e"
FOLLOWS_RECORDED = "~"


def _identity(tool: str, args: Any) -> tuple[str, list[str]]:
    parsed = _parse_if_json(args)
    strings: list[str] = []

    def leaf(value: Any) -> Any:
        return _canonical_scalar(value)

    def text_of(value: str) -> str:
        strings.append(value)
        return stable_text(value)

    value = stable_value({} if parsed is None else parsed, fold_case=True, leaf=leaf, text_of=text_of)
    return f"{normalize_tool_name(tool)}({_dumps(value)})", structure.argument_values(strings)


def split_identity(ident: str) -> tuple[str, tuple[str, ...]]:
    """(the identity, the digests of the values its arguments name), live or recorded."""
    head, sep, tail = ident.rpartition(FOLLOWS_LIVE)
    if not sep:
        head, sep, tail = ident.partition(FOLLOWS_RECORDED)
        if not sep:
            return ident, ()
    return head, tuple(tail.split(".")) if tail else ()


def result_fingerprint(content: Any) -> str:
    """A short stable hash of a tool result's template, without per-call noise (times, timings),
    folded as arguments are (case and spaces of short strings), then the counters it names
    (`slotted`) and its tokens and followable values (`proxy.guards.structure`).

    Loop detection compares these, never the content: a status that differs only by its
    `checked_at` or its request id, or a test run only by "in 0.31s", is the same result; a page
    of new UUIDs is not.
    """
    parsed = _parse_if_json(content)
    harvest = structure.Harvest()
    value = stable_value(
        parsed, fold_case=True, leaf=_canonical_scalar, result=True, text_of=harvest.template
    )
    template = _dumps(value)
    return slotted(template) + harvest.suffix()


def slotted(text: str) -> str:
    """`<24-hex hash>` of a stable text, or `<hash of the text with its counters replaced>|n|n...`
    when it names counters ("attempt 3", "retry #4": `volatile.result_slots`), so the detector can
    tell a counter that went up by one from a result that changed (`loop.turn.Turn.same_as`)."""
    skeleton, slots = result_slots(text)
    if not slots:
        return fingerprint_text(text)
    return "|".join((fingerprint_text(skeleton), *slots))


class Fingerprinted(NamedTuple):
    """A call's arguments as the trace keeps them for replay: hashes of its exact signature and of
    its identity (`call_fingerprints`), computed from the full arguments before any truncation or
    redaction. Loop detection only compares these, so a replay decides as the live guards did."""

    sig: str
    ident: str


def fingerprint_text(text: str) -> str:
    # surrogatepass: a lone surrogate (read from a `\ud83d` escape) hashes instead of raising
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


def call_keys(tool: str, args: Any) -> tuple[str, str]:
    """(exact signature, identity) of a call, or its recorded fingerprints when replayed. The
    identity carries the digests of the values its arguments name (`split_identity` reads them)."""
    if isinstance(args, Fingerprinted):
        return args.sig, args.ident
    ident, values = _identity(tool, args)
    return signature(tool, args), (f"{ident}{FOLLOWS_LIVE}{'.'.join(values)}" if values else ident)


def call_sig(tool: str, args: Any) -> str:
    """`call_keys`' exact signature alone (an MCP answer is matched back to its call by it)."""
    return args.sig if isinstance(args, Fingerprinted) else signature(tool, args)


def call_fingerprints(tool: str, args: Any) -> Fingerprinted:
    """What the trace records of a call's arguments for replay: hashes, and the digests of the
    values the arguments name (as `call_keys`' identity carries them)."""
    sig, ident = call_keys(tool, args)
    ident, values = split_identity(ident)
    recorded = fingerprint_text(ident)
    if values:
        recorded = f"{recorded}{FOLLOWS_RECORDED}{'.'.join(values)}"
    return Fingerprinted(fingerprint_text(sig), recorded)


class RecordedError(str):
    """A failure as the trace keeps it (its `error_fingerprint`), fed back by a replay."""


def error_fingerprint(text: str | None) -> str | None:
    """A failure without per-call noise, hashed: what the guards compare, and what the trace
    records for replay (so the same failure compares equal live and replayed)."""
    if text is None:
        return None
    if isinstance(text, RecordedError):
        return str(text)
    harvest = structure.Harvest()
    template = fold_text(harvest.template(text))
    return slotted(template) + harvest.suffix()


def content_text(content: Any, limit: int = 500) -> str:
    """The text of a result (MCP content blocks, OpenAI/Anthropic tool message parts), cut to `limit`.

    Used as the error "key" of retry-without-progress: the same failure gives the same text.
    A list joins its parts' texts (each cut to `limit`); a dict is its `text`, else the text of its
    `content`, else its `message`, else its canonical JSON. Evaluated with an explicit stack.
    """
    done: list[str] = []  # texts of finished nodes, in order
    # (node, None, _) to visit a node; (None, n, wrapped) to join the last n texts into one list's
    # text (a wrapper dict around the list cuts and strips that text once more, as recursion did)
    work: list[tuple[Any, int | None, bool]] = [(content, None, False)]
    while work:
        node, join, wrapped = work.pop()
        if join is not None:
            parts = done[len(done) - join :] if join else []
            del done[len(done) - join :]
            text = "\n".join(p for p in parts if p).strip()[:limit]
            done.append(text.strip()[:limit] if wrapped else text)
            continue
        wrapper = False
        while isinstance(node, dict) and not isinstance(node.get("text"), str) and "content" in node:
            node = node["content"]  # a wrapper's text is its content's text
            wrapper = True
        if isinstance(node, list):
            work.append((None, len(node), wrapper))
            work.extend((part, None, False) for part in reversed(node))
            continue
        if isinstance(node, str):
            text = node
        elif isinstance(node, dict):
            if isinstance(node.get("text"), str):
                text = node["text"]
            elif isinstance(node.get("message"), str):  # a JSON-RPC error object
                text = node["message"]
            else:
                text = canonical_args(node)
        elif node is None:
            text = ""
        else:
            text = canonical_args(node)
        text = text.strip()[:limit]
        done.append(text.strip()[:limit] if wrapper else text)
    return done[-1]
