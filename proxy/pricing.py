"""Model name + token usage → USD.

Prices come from, in order: the config's `pricing_table` overrides, the offline snapshot of the
`genai-prices` package (pinned, so a given trace always costs the same), and a fallback of
$10 / 1M input and $30 / 1M output tokens for models neither knows. The fallback is never $0, so
a typo or a private fine-tune cannot slip past `max_cost_usd` (LangSight's rule, SPEC §5.2).
See docs/pricing.md.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, getcontext
from typing import Any, NamedTuple

import genai_prices
from genai_prices import data_snapshot
from genai_prices import types as gp_types

from proxy.dialects.base import Usage

FALLBACK_INPUT_PER_1M = 10.0
FALLBACK_OUTPUT_PER_1M = 30.0
# genai-prices has no snapshot-date field; this is the newest dated price observation in the
# 0.2.3 data (a model "launched on Bedrock 2026-11-04"). tests/test_pricing.py fails when the
# installed version changes, so the two are updated together.
SNAPSHOT_VERSION = "0.2.3"
SNAPSHOT_DATE = "2026-11-04"
# Providers tried by id when a bare name matches no provider's naming pattern (embedding models,
# for instance, are only found inside their provider).
_PROVIDER_HINTS = ("openai", "anthropic", "google")

# bound the per-name caches: model names come from clients, so they are not a fixed set
_CACHE_LIMIT = 4096
UNKNOWN_MODEL_WARNINGS = 100  # distinct unknown models warned about per process, then one line

_DATE_SUFFIX = re.compile(r"[-@](\d{4}-\d{2}-\d{2}|\d{8}|\d{4})$")

log = logging.getLogger("tripwire.pricing")


class PriceQuote(NamedTuple):
    """One call's price (a NamedTuple: built on every call, and a frozen dataclass's init costs more)."""

    cost_usd: float
    model: str  # the name that was priced (or, for the fallback, the name warned about)
    known: bool  # False when the fallback price was used
    source: str  # "override" | "genai-prices" | "fallback"
    matched: str | None = None  # genai-prices model id, when priced from the package


def name_variants(model: str) -> list[str]:
    """The model, then without a date suffix, without a provider prefix, and without both."""
    out = [model]
    bare = model.rsplit("/", 1)[1] if "/" in model else model
    for name in (_DATE_SUFFIX.sub("", model), bare, _DATE_SUFFIX.sub("", bare)):
        if name and name not in out:
            out.append(name)
    return out


M_TOKENS = 1_000_000


@dataclass(frozen=True)
class LinearPrice:
    """A model's package price when it is linear in the token counts (no tiers, no dated or
    time-of-day prices): the coefficients, per million tokens, probed once from the package's own
    calculation. `price()` then gives the package's exact Decimal result with a handful of Decimal
    operations instead of the package's general calculation (a fraction of a millisecond per call).
    Cache reads and writes are parts of the prompt, priced at their own rate or the input rate,
    whatever the package does for the model: the probes include them."""

    per_call: Decimal
    uncached_input: Decimal
    cache_read: Decimal
    cache_write: Decimal
    output: Decimal
    # the coefficients as integers over one power of ten, for price_float (None: some is negative)
    _scaled: tuple[int, int, int, int, int, int, int] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        coefficients = (self.per_call, self.uncached_input, self.cache_read, self.cache_write, self.output)
        scaled = None
        if all(c.is_finite() and c >= 0 for c in coefficients):
            exponent = min(0, *(int(c.as_tuple().exponent) for c in coefficients))
            per_call, uncached, read, write, output = (int(c.scaleb(-exponent)) for c in coefficients)
            # Decimal's sums and products are exact while the total has at most `prec` digits
            scaled = (
                per_call * M_TOKENS,
                uncached,
                read,
                write,
                output,
                10 ** (6 - exponent),
                10 ** getcontext().prec,
            )
        object.__setattr__(self, "_scaled", scaled)

    @classmethod
    def of(cls, found: tuple[gp_types.Provider, gp_types.ModelInfo]) -> LinearPrice | None:
        provider, model = found
        prices = model.prices
        if not isinstance(prices, gp_types.ModelPrice):
            return None  # dated prices: the package picks them by the call's time
        if any(isinstance(v, gp_types.TieredPrices) for v in vars(prices).values()):
            return None  # the rate depends on the prompt's size

        def total(**counts: int) -> Decimal:
            calc = model.calc_price(genai_prices.Usage(**counts), provider)
            return Decimal(calc.total_price)

        try:
            base = total()
            return cls(
                per_call=base,
                uncached_input=total(input_tokens=M_TOKENS) - base,
                cache_read=total(input_tokens=M_TOKENS, cache_read_tokens=M_TOKENS) - base,
                cache_write=total(input_tokens=M_TOKENS, cache_write_tokens=M_TOKENS) - base,
                output=total(output_tokens=M_TOKENS) - base,
            )
        except (ValueError, ArithmeticError, LookupError):
            return None  # the package refuses a probe: each call goes through its calculation

    def price(self, prompt: int, completion: int, cache_read: int, cache_write: int) -> Decimal:
        """Counts as `Pricing._package_cost` clamps them: cache_read + cache_write <= prompt.

        A term of zero tokens is zero and adding it changes no value, so it is skipped (most calls
        have no cache reads or writes)."""
        total = self.per_call + self.uncached_input * (prompt - cache_read - cache_write) / M_TOKENS
        if cache_read:
            total += self.cache_read * cache_read / M_TOKENS
        if cache_write:
            total += self.cache_write * cache_write / M_TOKENS
        return total + self.output * completion / M_TOKENS

    def price_float(self, prompt: int, completion: int, cache_read: int, cache_write: int) -> float:
        """`float(price(...))` in integers: the coefficients are decimals over one power of ten, so
        the price is an integer over it; Python's int division rounds as `float(Decimal)` does. Where
        Decimal would have rounded (a total past its precision), the Decimal way decides."""
        scaled = self._scaled
        if scaled is not None:
            per_call, uncached, read, write, output, denominator, limit = scaled
            total = per_call + uncached * (prompt - cache_read - cache_write) + output * completion
            if cache_read:
                total += read * cache_read
            if cache_write:
                total += write * cache_write
            if total < limit:
                return total / denominator
        return float(self.price(prompt, completion, cache_read, cache_write))


class Pricing:
    """Prices usage; one instance per app. Lookups are cached per model name, the candidate names
    per list of models, and a linear model's price coefficients per model (LinearPrice)."""

    snapshot_version = SNAPSHOT_VERSION
    snapshot_date = SNAPSHOT_DATE

    def __init__(
        self,
        overrides: dict[str, tuple[float, float]] | None = None,
        logger: logging.Logger = log,
    ) -> None:
        self._overrides = {name.lower(): (float(p[0]), float(p[1])) for name, p in (overrides or {}).items()}
        self._log = logger
        self._found: dict[str, tuple[gp_types.Provider, gp_types.ModelInfo] | None] = {}
        self._warned: set[str] = set()
        self._rates: dict[str, tuple[float, float]] = {}  # estimate(): per-1M rates by model names
        self._candidates: dict[tuple[str | None, ...], list[str]] = {}
        self._linear: dict[str, LinearPrice | None] = {}  # by genai-prices provider and model id
        # by list of models: the name priced and its linear price, when the first name that prices
        # is a package model with one (no override among the candidates): the common call's way
        self._resolved: dict[tuple[str | None, ...], tuple[str, str, LinearPrice] | None] = {}

    def cost(
        self, usage: Usage, models: Sequence[str | None], at: datetime | None = None, *, warn: bool = True
    ) -> PriceQuote:
        """Price `usage`; `models` in priority order: response model first, then the request's.

        `at` selects dated prices in the package (None = now). `warn`: log the unknown-model warning
        (SPEC §5.2) with this call's cost; False for a probe that prices no real call (estimate()'s
        per-million rates, a call the upstream never answered), so the warning carries a real call's
        cost, once per model.
        """
        key = tuple(models)
        resolved = self._resolved.get(key, _UNRESOLVED)
        if resolved is _UNRESOLVED:
            resolved = self._resolve(key)
        if resolved is not None:
            name, matched, linear = resolved
            return PriceQuote(_linear_cost(usage, linear), name, True, "genai-prices", matched)
        names = [m for m in models if m]
        candidates = self._candidate_names(models, names)
        for name in candidates:
            rates = self._overrides.get(name.lower())
            if rates is not None:
                cost = _per_million(usage.prompt_tokens, usage.completion_tokens, rates)
                return PriceQuote(cost, name, True, "override")
        for name in candidates:
            found = self._lookup(name)
            if found is None:
                continue
            try:
                cost = self._package_cost(usage, found, at)
            except (ValueError, ArithmeticError, LookupError) as exc:  # bad usage numbers: fail open
                self._log.debug("genai-prices failed for %s: %s", name, exc)
                continue
            return PriceQuote(cost, name, True, "genai-prices", found[1].id)
        model = names[0] if names else "unknown"
        cost = _per_million(
            usage.prompt_tokens, usage.completion_tokens, (FALLBACK_INPUT_PER_1M, FALLBACK_OUTPUT_PER_1M)
        )
        if warn and model not in self._warned and len(self._warned) <= UNKNOWN_MODEL_WARNINGS:
            self._warned.add(model)
            if len(self._warned) > UNKNOWN_MODEL_WARNINGS:
                # an agent (or an attacker) naming endless models must not flood the log
                self._log.warning(
                    "budget.unknown_model_warnings_suppressed limit=%d: further unknown models are charged "
                    "the fallback price without a warning",
                    UNKNOWN_MODEL_WARNINGS,
                )
            else:
                self._log.warning(
                    'budget.unknown_model_cost_estimated model_id=%s estimated_cost_usd=%.6f hint="%s"',
                    model,
                    cost,
                    "Add this model to pricing_table to get accurate cost tracking",
                )
        return PriceQuote(cost, model, False, "fallback")

    def _resolve(self, key: tuple[str | None, ...]) -> tuple[str, str, LinearPrice] | None:
        """What `cost` would price `key`'s models by, when that is a linear package price (whose
        result depends on the usage alone, never fails, and ignores `at`); None otherwise."""
        names = [m for m in key if m]
        candidates = self._candidate_names(key, names)
        resolved = None
        if not any(name.lower() in self._overrides for name in candidates):
            for name in candidates:
                found = self._lookup(name)
                if found is None:
                    continue
                linear = self._linear_of(found)
                if linear is not None:
                    resolved = (name, found[1].id, linear)
                break
        if len(self._resolved) >= _CACHE_LIMIT:
            self._resolved.clear()
        self._resolved[key] = resolved
        return resolved

    def estimate(self, usage: Usage, models: list[str | None]) -> float:
        """A fast linear estimate for budget reservations, from per-model rates cached on first use.

        `cost()` runs the price package's exact calculation (tiers, cache rates), which costs a
        fraction of a millisecond; a reservation is an estimate anyway, so it uses two cached
        per-million rates instead. Never $0 for an unknown model (the fallback rates apply).
        """
        key = "\x00".join(m for m in models if m)
        rates = self._rates.get(key)
        if rates is None:
            # probes, not calls: the unknown-model warning waits for a real call's own cost
            per_in = self.cost(
                Usage(prompt_tokens=M_TOKENS, total_tokens=M_TOKENS), models, warn=False
            ).cost_usd
            per_out = self.cost(
                Usage(completion_tokens=M_TOKENS, total_tokens=M_TOKENS), models, warn=False
            ).cost_usd
            if len(self._rates) >= _CACHE_LIMIT:
                self._rates.clear()
            rates = self._rates[key] = (per_in, per_out)
        return _per_million(usage.prompt_tokens, usage.completion_tokens, rates)

    def estimate_tokens(self, prompt_tokens: int, completion_tokens: int, model: str | None) -> float:
        """`estimate()` of one model's counts, as a call's reservation asks it: its cache key is
        the name itself, so a known model's estimate builds nothing."""
        rates = self._rates.get(model or "")
        if rates is None:
            usage = Usage(prompt_tokens, completion_tokens, prompt_tokens + completion_tokens)
            return self.estimate(usage, [model])
        return _per_million(prompt_tokens, completion_tokens, rates)

    def _candidate_names(self, models: Sequence[str | None], names: list[str]) -> list[str]:
        """Every name to try, in order: each model, then its variants (name_variants)."""
        key = tuple(models)
        found = self._candidates.get(key)
        if found is None:
            found = []
            for name in names:
                for variant in name_variants(name):
                    if variant not in found:
                        found.append(variant)
            if len(self._candidates) >= _CACHE_LIMIT:
                self._candidates.clear()
            self._candidates[key] = found
        return found

    def _lookup(self, name: str) -> tuple[gp_types.Provider, gp_types.ModelInfo] | None:
        key = name.lower()
        if key in self._found:
            return self._found[key]
        snapshot = data_snapshot.get_snapshot()
        found = None
        for provider_id in (None, *_PROVIDER_HINTS):
            try:
                found = snapshot.find_provider_model(key, None, provider_id, None)
                break
            except LookupError:
                continue
        if len(self._found) >= _CACHE_LIMIT:
            self._found.clear()
        self._found[key] = found
        return found

    def _package_cost(
        self, usage: Usage, found: tuple[gp_types.Provider, gp_types.ModelInfo], at: datetime | None
    ) -> float:
        provider, model = found
        linear = self._linear_of(found)
        if linear is not None:
            return _linear_cost(usage, linear)
        prompt, completion, cache_read, cache_write = _clamped(usage)
        fields: dict[str, Any] = {"input_tokens": prompt, "output_tokens": completion}
        if cache_read:
            fields["cache_read_tokens"] = cache_read
        if cache_write:
            fields["cache_write_tokens"] = cache_write
        calc = model.calc_price(genai_prices.Usage(**fields), provider, genai_request_timestamp=at)
        return float(calc.total_price)

    def _linear_of(self, found: tuple[gp_types.Provider, gp_types.ModelInfo]) -> LinearPrice | None:
        provider, model = found
        key = f"{provider.id}\x00{model.id}"
        if key not in self._linear:
            if len(self._linear) >= _CACHE_LIMIT:
                self._linear.clear()
            self._linear[key] = LinearPrice.of(found)
        return self._linear[key]


_UNRESOLVED: Any = object()  # Pricing._resolved has no entry for these models yet


def _clamped(usage: Usage) -> tuple[int, int, int, int]:
    """(prompt, completion, cache_read, cache_write) as the package prices them: none negative,
    cache reads and writes parts of the prompt (cache_read + cache_write <= prompt)."""
    prompt = max(usage.prompt_tokens, 0)
    cache_read = min(max(usage.cached_tokens, 0), prompt)
    cache_write = min(max(usage.cache_creation_tokens, 0), prompt - cache_read)
    return prompt, max(usage.completion_tokens, 0), cache_read, cache_write


def _linear_cost(usage: Usage, linear: LinearPrice) -> float:
    """`Pricing._package_cost` for a linear price."""
    prompt, completion, cache_read, cache_write = _clamped(usage)
    return linear.price_float(prompt, completion, cache_read, cache_write)


def load_snapshot() -> None:
    """Load the package's price snapshot now (it loads on first use otherwise: the first call)."""
    data_snapshot.get_snapshot()


def _per_million(prompt_tokens: int, completion_tokens: int, rates: tuple[float, float]) -> float:
    return (prompt_tokens * rates[0] + completion_tokens * rates[1]) / 1_000_000
