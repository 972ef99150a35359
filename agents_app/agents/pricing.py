"""PricingAgent: recommends a shelf price per part, in integer cents.

Payload::

    {"items": [{"sku": "RTR-305F", "cost_cents": 3000, "category": "brake_rotor",
                "competitor_prices_cents": [5499, 5999, 6499]}],
     "rules": {"target_margin_pct": {"brake_rotor": 40, "default": 35},
               "min_margin_pct": 15, "max_above_competitor_pct": 10}}

For each item, in order, with margins on the selling price:

1. target: the cost at the category's target margin, ``cost / (1 - target)``;
2. competitor cap: no more than ``max_above_competitor_pct`` over the median
   competitor price, when there are competitor prices;
3. margin floor: never below ``cost / (1 - min_margin)``;
4. charm price: up to the next price ending in 99 cents.

Each item's result names the rule that set its price.
"""

from __future__ import annotations

import statistics
from typing import Any

from task_queue.agent import Agent, InvalidPayload, TaskContext, require
from task_queue.registry import register

DEFAULT_RULES = {
    "target_margin_pct": {"default": 35},
    "min_margin_pct": 15,
    "max_above_competitor_pct": 10,
}


def ceil_div(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


def price_at_margin(cost_cents: int, margin_pct: int) -> int:
    """The lowest whole-cent price whose margin on price is at least ``margin_pct``."""
    return ceil_div(cost_cents * 100, 100 - margin_pct)


def charm(price_cents: int) -> int:
    """Up to the next price ending in .99 (12.34 → 12.99; 12.99 stays)."""
    return price_cents // 100 * 100 + 99


def _percent(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 100:
        raise InvalidPayload(field, "must be an integer percentage from 0 to 99")
    return value


def read_rules(payload: dict[str, Any]) -> dict[str, Any]:
    given = payload.get("rules", {})
    if not isinstance(given, dict):
        raise InvalidPayload("rules", "must be an object")
    rules = {**DEFAULT_RULES, **given}
    targets = rules["target_margin_pct"]
    if not isinstance(targets, dict) or "default" not in targets:
        raise InvalidPayload("rules.target_margin_pct", 'must be an object with a "default"')
    for category, pct in targets.items():
        _percent(pct, f"rules.target_margin_pct.{category}")
    _percent(rules["min_margin_pct"], "rules.min_margin_pct")
    above = rules["max_above_competitor_pct"]
    if isinstance(above, bool) or not isinstance(above, int) or above < 0:
        raise InvalidPayload("rules.max_above_competitor_pct", "must be a non-negative integer")
    return rules


def price_item(item: Any, index: int, rules: dict[str, Any]) -> dict[str, Any]:
    where = f"items[{index}]"
    if not isinstance(item, dict):
        raise InvalidPayload(where, "must be an object")
    sku = item.get("sku")
    if not isinstance(sku, str) or not sku:
        raise InvalidPayload(f"{where}.sku", "must be a non-empty string")
    cost = item.get("cost_cents")
    if isinstance(cost, bool) or not isinstance(cost, int) or cost <= 0:
        raise InvalidPayload(f"{where}.cost_cents", "must be a positive integer")
    competitors = item.get("competitor_prices_cents", [])
    if not isinstance(competitors, list) or not all(
        isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in competitors
    ):
        raise InvalidPayload(f"{where}.competitor_prices_cents", "must be positive integers")

    targets = rules["target_margin_pct"]
    target_pct = targets.get(item.get("category"), targets["default"])
    price, rule = price_at_margin(cost, target_pct), "target_margin"
    median = int(statistics.median(competitors)) if competitors else None
    if median is not None:
        cap = median * (100 + rules["max_above_competitor_pct"]) // 100
        if cap < price:
            price, rule = cap, "competitor_cap"
    floor = price_at_margin(cost, rules["min_margin_pct"])
    if price < floor:
        price, rule = floor, "margin_floor"
    final = charm(price)
    return {
        "sku": sku,
        "cost_cents": cost,
        "price_cents": final,
        "margin_pct": round((final - cost) * 100 / final, 1),
        "rule": rule,
        "competitor_median_cents": median,
    }


@register
class PricingAgent(Agent):
    name = "PricingAgent"
    task_types = ("price_parts", "refresh_pricing")
    description = "Recommends prices from cost, target margins and competitor prices."

    def handle(self, task: TaskContext) -> dict[str, Any]:
        items = require(task.payload, "items", list)
        if not items:
            raise InvalidPayload("items", "must not be empty")
        rules = read_rules(task.payload)
        return {"items": [price_item(item, i, rules) for i, item in enumerate(items)]}

    def describe(self, task: TaskContext, result: dict[str, Any]) -> str:
        items = result["items"]
        shown = ", ".join(f"{i['sku']} at {i['price_cents'] / 100:.2f}" for i in items[:3])
        more = f" and {len(items) - 3} more" if len(items) > 3 else ""
        return f"PricingAgent priced {len(items)} parts: {shown}{more}"
