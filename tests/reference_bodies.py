"""Request bodies documented by the reference systems, shared by the tests that send them."""

from __future__ import annotations

from typing import Any

# LangSight's documented prevention-config example (../shared/reference/seeds/), as sent with PUT.
# Treat as read-only: tests that change it deep-copy it first.
LANGSIGHT_BODY: dict[str, Any] = {
    "loop_detection": {"enabled": True, "threshold": 3, "action": "terminate", "max_steps": 50},
    "budget": {"max_cost_usd": 0.50, "soft_alert_threshold_usd": 0.40, "max_wall_time_seconds": 120},
    "circuit_breaker": {
        "enabled": True,
        "open_after_failures": 5,
        "cooldown_seconds": 30,
        "half_open_max_calls": 3,
    },
}
