"""A conversation's per-message work, done once per message rather than once per call.

Agents resend their whole history on every call (Claude Code and Codex bodies are hundreds of KB).
What Tripwire derives from the messages, the digest of every prefix (proxy/episodes.py: session
lineage and the recorded prompt delta) and the prompt's token estimate (budget reservations), would
then cost a walk over the whole history per call, growing with the conversation. So the most recent
conversations are remembered with the parsed messages of their last request: a request whose
messages start with exactly those (one comparison, in C: `list ==`) takes their digests, hasher
state and token count and walks only its new messages.

The comparison is Python equality, which holds for `1` and `1.0` (or `true` and `1`) where the
digests, taken of the JSON text, would differ: a resent history with such a change continues as the
same history, harmless for what the digests decide (which run, which messages are new).

Bounded: conversations shorter than `MIN_MESSAGES` are cheap to walk and are not kept; at most
`MAX_CONVERSATIONS` are, holding at most `MAX_MESSAGES` messages in all (least recently used first
out). Pure, no I/O.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import orjson

from proxy import jsonparse

MIN_MESSAGES = 32
MAX_CONVERSATIONS = 64
MAX_MESSAGES = 40_000
_PER_KEY = 4  # conversations sharing their first two messages (sub-agents of one task)


def message_bytes(message: Any) -> bytes:
    try:
        return orjson.dumps(message)
    except TypeError:  # nesting deeper than orjson writes, integers beyond 64 bits, lone surrogates
        return jsonparse.dumps_text(message).encode("utf-8")


_EMPTY = hashlib.blake2b(digest_size=16)  # every walk starts from it (copied: cheaper than made)
_EMPTY_DIGEST = _EMPTY.digest()


def _size(raw: bytes) -> bytes:
    return len(raw).to_bytes(8, "little")


class Walked:
    """One request's conversation, walked: the digest of every prefix, from the empty one to the
    whole, as sent and as lineage compares them (`normalise`d), and the prompt's token estimate."""

    # one per request: slots make it and its reads cheaper
    __slots__ = (
        "messages",
        "parsed",
        "sent",
        "lineage",
        "tokens",
        "_forked",
        "_h",
    )

    def __init__(
        self,
        messages: list[Any],
        normalise: Callable[[Any], Any],
        count: Callable[[Any], int],
        prior: Walked | None = None,
    ) -> None:
        self.messages = messages
        self.parsed: Any = None  # the dialect's reading of these messages (dialects.base.ParseState)
        self._forked: Any = None  # the lineage chain's hasher, once it differs from the sent one
        if prior is None:
            self.sent = [_EMPTY_DIGEST]
            self.lineage = self.sent
            self._h = _EMPTY.copy()
            self.tokens = 0  # the sum of `count` over the messages, each counted in the same walk
            new = messages
        else:  # the prior request's messages are this one's first ones: go on from there
            self.sent = prior.sent[:]
            self.lineage = self.sent if prior.lineage is prior.sent else prior.lineage[:]
            self._h = prior._h.copy()
            self._forked = prior._forked.copy() if prior._forked is not None else None
            self.tokens = prior.tokens
            new = messages[len(prior.messages) :]
        self._extend(new, normalise, count)

    def _extend(self, new: list[Any], normalise: Callable[[Any], Any], count: Callable[[Any], int]) -> None:
        """Digest and count each new message: one walk for the lineage, the prompt delta and the
        prompt's token estimate (each message counted once across the calls that resend it)."""
        h, forked, sent, lineage = self._h, self._forked, self.sent, self.lineage
        update, digest, dumps = h.update, h.digest, orjson.dumps
        tokens = self.tokens
        for message in new:
            tokens += count(message)
            normalised = normalise(message)
            if forked is None and normalised is not message:
                # the first message lineage sees differently (an Anthropic cache_control marker)
                forked, lineage = h.copy(), sent[:]
            try:  # message_bytes and _size, inline: this runs for every message of every request
                raw = dumps(message)
            except TypeError:
                raw = message_bytes(message)
            update(len(raw).to_bytes(8, "little"))
            update(raw)
            sent.append(digest())
            if forked is not None:
                if normalised is not message:
                    raw = message_bytes(normalised)
                forked.update(_size(raw))
                forked.update(raw)
                lineage.append(forked.digest())
        self._forked, self.lineage, self.tokens = forked, lineage, tokens


class Find:
    """`RecentConversations.walk`'s default: look for the request to go on from."""


FIND = Find()


class RecentConversations:
    """The last request of the most recent long conversations (see the module docstring)."""

    def __init__(self) -> None:
        self._by_key: OrderedDict[bytes, list[Walked]] = OrderedDict()
        self._messages = 0

    @staticmethod
    def _key(messages: list[Any]) -> bytes:
        """The digest of the first two messages as sent: the same bytes as a walk's `sent[2]`, which
        `walk` takes instead of hashing them again."""
        h = _EMPTY.copy()
        for message in messages[:2]:
            raw = message_bytes(message)
            h.update(_size(raw))
            h.update(raw)
        return h.digest()

    def find(self, messages: list[Any]) -> Walked | None:
        """The longest kept request whose messages this one starts with (compared whole, in C), or
        None; short conversations are never kept. The parse stage asks first, so the dialect reads
        only the new messages; `walk` then goes on from the same request without comparing again."""
        if len(messages) < MIN_MESSAGES:
            return None
        prior = None
        for candidate in self._by_key.get(self._key(messages), ()):
            n = len(candidate.messages)
            if (
                n <= len(messages)
                and (prior is None or n > len(prior.messages))
                and messages[:n] == candidate.messages
            ):
                prior = candidate
        return prior

    def walk(
        self,
        messages: list[Any],
        normalise: Callable[[Any], Any],
        count: Callable[[Any], int],
        prior: Walked | None | Find = FIND,
    ) -> Walked:
        """`messages` walked, going on from `prior` (FIND: `find` it here), and kept (a copy of the
        list: the caller's may change; a short conversation, not kept, walks the caller's own)."""
        if len(messages) < MIN_MESSAGES:
            return Walked(messages, normalise, count)
        if isinstance(prior, Find):
            prior = self.find(messages)
        walked = Walked(list(messages), normalise, count, prior)
        key = walked.sent[2]  # `_key(messages)`, already digested by the walk (or the prior's)
        kept = self._by_key.get(key, [])
        if prior is not None and prior in kept:  # (a concurrent request may have gone on from it first)
            kept.remove(prior)
            self._messages -= len(prior.messages)
        kept.insert(0, walked)
        self._messages += len(messages)
        while len(kept) > _PER_KEY:
            self._messages -= len(kept.pop().messages)
        self._by_key[key] = kept
        self._by_key.move_to_end(key)
        while self._by_key and (len(self._by_key) > MAX_CONVERSATIONS or self._messages > MAX_MESSAGES):
            _, dropped = self._by_key.popitem(last=False)
            self._messages -= sum(len(w.messages) for w in dropped)
        return walked
