"""Pricing: package prices (checked against genai-prices itself), overrides, name variants, fallback."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from decimal import Decimal

import genai_prices
import pytest

from proxy.dialects.base import Usage
from proxy.pricing import PriceQuote, Pricing, name_variants

hypothesis = pytest.importorskip("hypothesis")  # in the dev extra; the mcp<2 env has only [test]
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

AT = datetime(2026, 11, 1, tzinfo=UTC)


def package_price(model: str, at: datetime = AT, provider_id: str | None = None, **usage: int) -> float:
    calc = genai_prices.calc_price(
        genai_prices.Usage(**usage), model, provider_id=provider_id, genai_request_timestamp=at
    )
    return float(calc.total_price)


def test_snapshot_is_the_pinned_package() -> None:
    # SNAPSHOT_DATE in proxy/pricing.py describes this exact version: update both together
    assert genai_prices.__version__ == Pricing.snapshot_version == "0.2.3"
    assert Pricing.snapshot_date == "2026-11-04"


@pytest.mark.parametrize("model", ["gpt-4o", "gpt-4o-mini", "claude-sonnet-4-5", "gemini-2.5-pro"])
def test_known_models_priced_from_the_package(model: str) -> None:
    quote = Pricing().cost(Usage(prompt_tokens=1000, completion_tokens=500, total_tokens=1500), [model], AT)
    assert quote.known and quote.source == "genai-prices" and quote.model == model
    assert quote.cost_usd == pytest.approx(package_price(model, input_tokens=1000, output_tokens=500))
    assert quote.cost_usd > 0


def test_embedding_model_found_through_its_provider() -> None:
    quote = Pricing().cost(Usage(prompt_tokens=10_000), ["text-embedding-3-small"], AT)
    assert quote.known and quote.matched == "text-embedding-3-small"
    assert quote.cost_usd == pytest.approx(
        package_price("text-embedding-3-small", provider_id="openai", input_tokens=10_000)
    )


def test_unknown_model_fallback_is_exact_and_warned_once(caplog: pytest.LogCaptureFixture) -> None:
    pricing = Pricing()
    with caplog.at_level(logging.WARNING, logger="tripwire.pricing"):
        first = pricing.cost(Usage(prompt_tokens=1000, completion_tokens=500), ["my-custom-model"])
        second = pricing.cost(Usage(prompt_tokens=2000, completion_tokens=0), ["my-custom-model"])
    assert first == PriceQuote(0.025, "my-custom-model", False, "fallback")
    assert second.cost_usd == pytest.approx(0.02)
    lines = [r.getMessage() for r in caplog.records if r.name == "tripwire.pricing"]
    assert lines == [
        "budget.unknown_model_cost_estimated model_id=my-custom-model estimated_cost_usd=0.025000 "
        'hint="Add this model to pricing_table to get accurate cost tracking"'
    ]
    assert [r.levelno for r in caplog.records if r.name == "tripwire.pricing"] == [logging.WARNING]


def test_estimate_probes_do_not_warn_a_real_call_does(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 25: the reservation's 1M-token probe logged estimated_cost_usd=10.000000 on every
    model; the warning now waits for the first real call and carries its own cost."""
    pricing = Pricing()
    with caplog.at_level(logging.WARNING, logger="tripwire.pricing"):
        assert pricing.estimate_tokens(1000, 500, "my-custom-model") == pytest.approx(0.025)
        assert pricing.cost(Usage(), ["my-custom-model"], warn=False).cost_usd == 0.0
        assert [r for r in caplog.records if r.name == "tripwire.pricing"] == []
        pricing.cost(Usage(prompt_tokens=2000, completion_tokens=100), ["my-custom-model"])
        pricing.cost(Usage(prompt_tokens=1), ["my-custom-model"])
    lines = [r.getMessage() for r in caplog.records if r.name == "tripwire.pricing"]
    assert lines == [
        "budget.unknown_model_cost_estimated model_id=my-custom-model estimated_cost_usd=0.023000 "
        'hint="Add this model to pricing_table to get accurate cost tracking"'
    ]


def test_unknown_model_warnings_are_capped(caplog: pytest.LogCaptureFixture) -> None:
    from proxy.pricing import UNKNOWN_MODEL_WARNINGS

    pricing = Pricing()
    with caplog.at_level(logging.WARNING, logger="tripwire.pricing"):
        quotes = [pricing.cost(Usage(prompt_tokens=1000), [f"made-up-{i}"]) for i in range(2000)]
    # only the pricing logger's: another thread (an exporter of an earlier test) may log meanwhile
    lines = [r.getMessage() for r in caplog.records if r.name == "tripwire.pricing"]
    assert len(lines) == UNKNOWN_MODEL_WARNINGS + 1
    assert lines[-1].startswith("budget.unknown_model_warnings_suppressed limit=100")
    assert all(q.cost_usd == pytest.approx(0.01) for q in quotes)  # every one still charged


def test_fallback_never_zero_and_warns_per_model(caplog: pytest.LogCaptureFixture) -> None:
    pricing = Pricing()
    with caplog.at_level(logging.WARNING, logger="tripwire.pricing"):
        pricing.cost(Usage(prompt_tokens=1), ["a-model"])
        pricing.cost(Usage(prompt_tokens=1), ["b-model"])
        pricing.cost(Usage(prompt_tokens=1), ["a-model"])
    assert len([r for r in caplog.records if r.name == "tripwire.pricing"]) == 2
    assert pricing.cost(Usage(completion_tokens=1), ["a-model"]).cost_usd > 0


def test_override_wins_over_package() -> None:
    pricing = Pricing({"gpt-4o": (1.0, 2.0)})
    quote = pricing.cost(Usage(prompt_tokens=1_000_000, completion_tokens=500_000), ["gpt-4o-2024-08-06"])
    assert quote == PriceQuote(2.0, "gpt-4o", True, "override")


def test_override_adds_a_model_case_insensitively() -> None:
    pricing = Pricing({"My-Custom-Model": [0.5, 1.5]})  # YAML gives lists
    quote = pricing.cost(Usage(prompt_tokens=2_000_000, completion_tokens=1_000_000), ["my-custom-model"])
    assert quote.known and quote.cost_usd == pytest.approx(2.5)


def test_response_model_first_then_request_model() -> None:
    pricing = Pricing({"req-model": (1.0, 1.0), "resp-model": (2.0, 2.0)})
    usage = Usage(prompt_tokens=1_000_000)
    assert pricing.cost(usage, ["resp-model", "req-model"]).cost_usd == 2.0
    assert pricing.cost(usage, [None, "req-model"]).cost_usd == 1.0
    assert pricing.cost(usage, ["unknown-resp", "req-model"]).model == "req-model"


@pytest.mark.parametrize(
    ("name", "base"),
    [
        ("gpt-4o-2024-08-06", "gpt-4o"),
        ("claude-3-5-sonnet-20241022", "claude-3-5-sonnet"),
        ("openai/gpt-4o", "gpt-4o"),
        ("anthropic/claude-sonnet-4-5", "claude-sonnet-4-5"),
    ],
)
def test_dated_and_prefixed_names(name: str, base: str) -> None:
    assert base in name_variants(name)
    usage = Usage(prompt_tokens=1000, completion_tokens=500)
    quote = Pricing().cost(usage, [name], AT)
    assert quote.known
    assert quote.cost_usd == pytest.approx(package_price(base, input_tokens=1000, output_tokens=500))


def test_date_suffix_and_prefix_reach_an_override() -> None:
    pricing = Pricing({"my-model": (1.0, 0.0)})
    assert pricing.cost(Usage(prompt_tokens=10**6), ["acme/my-model-20250101"]).cost_usd == 1.0


def test_openai_cached_tokens_priced_at_cache_rate() -> None:
    usage = Usage(prompt_tokens=1000, completion_tokens=500, cached_tokens=800)
    quote = Pricing().cost(usage, ["gpt-4o"], AT)
    expected = package_price("gpt-4o", input_tokens=1000, output_tokens=500, cache_read_tokens=800)
    assert quote.cost_usd == pytest.approx(expected)
    # cheaper than the same tokens uncached
    assert quote.cost_usd < package_price("gpt-4o", input_tokens=1000, output_tokens=500)


def test_anthropic_cache_read_and_write() -> None:
    usage = Usage(prompt_tokens=5000, completion_tokens=100, cached_tokens=3000, cache_creation_tokens=1500)
    quote = Pricing().cost(usage, ["claude-sonnet-4-5"], AT)
    expected = package_price(
        "claude-sonnet-4-5",
        input_tokens=5000,
        output_tokens=100,
        cache_read_tokens=3000,
        cache_write_tokens=1500,
    )
    assert quote.cost_usd == pytest.approx(expected)
    plain = package_price("claude-sonnet-4-5", input_tokens=5000, output_tokens=100)
    assert quote.cost_usd != pytest.approx(plain)


def test_inconsistent_cache_counts_are_clamped_not_raised() -> None:
    quote = Pricing().cost(Usage(prompt_tokens=10, cached_tokens=50), ["gpt-4o"], AT)
    assert quote.known
    assert quote.cost_usd == pytest.approx(package_price("gpt-4o", input_tokens=10, cache_read_tokens=10))


def test_no_model_name_uses_fallback() -> None:
    quote = Pricing(logger=logging.getLogger("test.pricing")).cost(Usage(prompt_tokens=10**6), [])
    assert quote == PriceQuote(10.0, "unknown", False, "fallback")


def test_lookups_are_cached() -> None:
    pricing = Pricing()
    pricing.cost(Usage(prompt_tokens=1), ["gpt-4o", "nope-model"])
    assert "gpt-4o" in pricing._found
    found = pricing._found["gpt-4o"]
    pricing.cost(Usage(prompt_tokens=1), ["gpt-4o"])
    assert pricing._found["gpt-4o"] is found


def test_caches_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import proxy.pricing as pricing_module

    monkeypatch.setattr(pricing_module, "_CACHE_LIMIT", 10)
    pricing = Pricing(logger=logging.getLogger("test.pricing.bounded"))
    for i in range(25):
        assert not pricing.cost(Usage(prompt_tokens=1), [f"random-model-{i}"]).known
    assert len(pricing._found) <= 10 and len(pricing._warned) <= pricing_module.UNKNOWN_MODEL_WARNINGS + 1
    assert pricing.cost(Usage(prompt_tokens=1), ["gpt-4o"]).known


def test_estimate_matches_the_exact_price_for_linear_models() -> None:
    p = Pricing()
    for model in ("gpt-4o-mini", "my-custom-model"):
        usage = Usage(prompt_tokens=1234, completion_tokens=567, total_tokens=1801)
        assert p.estimate(usage, [model]) == pytest.approx(p.cost(usage, [model]).cost_usd)
    assert p.estimate(Usage(prompt_tokens=1000, total_tokens=1000), ["never-heard-of-it"]) == pytest.approx(
        0.01
    )


@pytest.mark.parametrize("model", ["gpt-4o-mini", "claude-sonnet-4-5", "never-heard-of-it", None])
def test_estimate_tokens_is_estimate_of_one_model(model: str | None) -> None:
    """The reservation's form: the same number as estimate(), on the first call (rates not yet
    cached) and on later ones (cached under the model's name)."""
    p = Pricing()
    usage = Usage(prompt_tokens=1234, completion_tokens=567, total_tokens=1801)
    first = p.estimate_tokens(1234, 567, model)
    assert first == p.estimate(usage, [model]) == p.estimate_tokens(1234, 567, model) > 0


def test_linear_prices_equal_the_packages_exact_calculation_for_every_model() -> None:
    """The cached coefficients (LinearPrice) give the package's own Decimal result, to the last digit,
    for every linear model of the snapshot; tiered and dated models keep the package's calculation."""
    import random

    from genai_prices import data_snapshot
    from genai_prices import types as gp_types

    from proxy.pricing import LinearPrice

    rng = random.Random(10)
    linear = other = 0
    for provider in data_snapshot.get_snapshot().providers:
        for model in provider.models:
            fast = LinearPrice.of((provider, model))
            if fast is None:
                assert not isinstance(model.prices, gp_types.ModelPrice) or any(
                    isinstance(v, gp_types.TieredPrices) for v in vars(model.prices).values()
                )
                other += 1
                continue
            linear += 1
            for _ in range(3):
                prompt = rng.randrange(0, 300_000)
                read = rng.randrange(0, prompt + 1)
                write = rng.randrange(0, prompt - read + 1)
                out = rng.randrange(0, 50_000)
                fields = {"input_tokens": prompt, "output_tokens": out}
                if read:
                    fields["cache_read_tokens"] = read
                if write:
                    fields["cache_write_tokens"] = write
                try:
                    exact = model.calc_price(genai_prices.Usage(**fields), provider).total_price
                except (ValueError, ArithmeticError, LookupError):
                    continue  # the package refuses these counts for this model (e.g. no cache pricing)
                assert fast.price(prompt, out, read, write) == exact, (provider.id, model.id, fields)
                assert fast.price_float(prompt, out, read, write) == float(exact), (
                    provider.id,
                    model.id,
                    fields,
                )
    assert linear > 1000 and other > 0


def test_tiered_models_keep_the_packages_calculation() -> None:
    # gemini-1.5-pro's rate doubles past 128k prompt tokens: a linear shortcut would get one side wrong
    for prompt in (100_000, 200_000):
        quote = Pricing().cost(Usage(prompt_tokens=prompt, completion_tokens=10), ["gemini-1.5-pro"], AT)
        assert quote.cost_usd == pytest.approx(
            package_price("gemini-1.5-pro", input_tokens=prompt, output_tokens=10)
        )


@pytest.mark.parametrize(
    "models", [["gpt-4o-mini"], ["gpt-4o-mini-2024-07-18", "gpt-4o-mini"], [None, "claude-sonnet-4-5"]]
)
def test_a_resolved_model_list_prices_as_the_general_way(models: list[str | None]) -> None:
    """cost() keeps, per list of models, the linear package price it resolves to: every later call
    gets exactly what the general way (name lookups, then the package's price) gives."""
    usages = [
        Usage(prompt_tokens=1234, completion_tokens=56),
        Usage(prompt_tokens=5000, completion_tokens=100, cached_tokens=3000, cache_creation_tokens=1500),
        Usage(prompt_tokens=10, completion_tokens=0, cached_tokens=50),  # clamped to the prompt
        Usage(),
    ]
    pricing, general = Pricing(), Pricing()
    names = [m for m in models if m]
    for usage in usages * 2:
        quote = pricing.cost(usage, tuple(models))
        name = quote.model
        found = general._lookup(name)
        assert found is not None and quote.known and quote.source == "genai-prices"
        assert name == next(n for n in general._candidate_names(models, names) if general._lookup(n))
        assert quote.cost_usd == general._package_cost(usage, found, None)
        assert quote.matched == found[1].id
    assert pricing._resolved  # the later calls took the kept way


def test_an_override_among_the_names_is_not_resolved_past() -> None:
    pricing = Pricing({"gpt-4o-mini": (1.0, 1.0)})
    for _ in range(2):
        quote = pricing.cost(Usage(prompt_tokens=10**6), ("gpt-4o-mini-2024-07-18", None))
        assert (quote.cost_usd, quote.source, quote.model) == (1.0, "override", "gpt-4o-mini")


@given(
    coefficients=st.lists(
        st.decimals(min_value=0, max_value=10**6, places=12, allow_nan=False, allow_infinity=False),
        min_size=5,
        max_size=5,
    ),
    prompt=st.integers(0, 10**12),
    completion=st.integers(0, 10**12),
    data=st.data(),
)
def test_a_linear_price_in_integers_equals_the_decimal_one(
    coefficients: list[Decimal], prompt: int, completion: int, data: st.DataObject
) -> None:
    """price_float, the integer way, gives float(price) for any coefficients and counts: where
    Decimal would round (a total past its 28 digits) it takes the Decimal way itself."""
    from proxy.pricing import LinearPrice

    read = data.draw(st.integers(0, prompt))
    write = data.draw(st.integers(0, prompt - read))
    linear = LinearPrice(*coefficients)
    assert linear.price_float(prompt, completion, read, write) == float(
        linear.price(prompt, completion, read, write)
    )
