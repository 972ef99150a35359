"""SupplierNormalizationAgent: turns a supplier's raw feed into canonical part records.

Payload::

    {"supplier": "Acme Parts",
     "items": [{"Part No": " rtr-305f ", "Brand": "  brembo ", "Price": "$54.90",
                "Weight": "12.5 lb", "Category": "Disc Rotor",
                "Specs": {"diameter_mm": 305, "position": "front"}}, ...]}

Suppliers name and format fields their own way. Each row's keys are matched
case-insensitively against known aliases; prices (``"$12.50"``, ``"12,50 EUR"``, a
number) become integer cents and a currency; weights (``"2 lb"``, ``"40 oz"``,
``"1.2kg"``, a number in kg) become kilograms; free-text categories map onto the
catalogue's. Rows without a sku or with an unreadable price are rejected with a
reason, without failing the task; a sku seen again is counted as a duplicate and
the first row kept. A row's ``attributes`` (or ``specs``) object passes through.
"""

from __future__ import annotations

import re
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any

from task_queue.agent import Agent, TaskContext, require
from task_queue.registry import register

ALIASES = {
    "sku": ("sku", "part_no", "part_number", "partnumber", "item_number", "item"),
    "brand": ("brand", "manufacturer", "make", "mfr"),
    "price": ("price", "unit_price", "list_price", "cost"),
    "weight": ("weight", "wt", "shipping_weight"),
    "category": ("category", "type", "product_type"),
    "description": ("description", "desc", "name", "title"),
    "attributes": ("attributes", "specs", "specifications"),
}
# Checked in order: the first keyword found in the text decides.
CATEGORY_KEYWORDS = (
    ("pad", "brake_pads"),
    ("rotor", "brake_rotor"),
    ("disc", "brake_rotor"),
    ("oil filter", "oil_filter"),
    ("spark", "spark_plug"),
    ("wheel", "wheel"),
    ("rim", "wheel"),
)
CURRENCY_SYMBOLS = {"$": "USD", "€": "EUR", "£": "GBP"}
CURRENCY_CODES = ("USD", "EUR", "GBP", "CAD")
KG_PER_UNIT = {
    "kg": Decimal(1),
    "g": Decimal("0.001"),
    "lb": Decimal("0.45359237"),
    "lbs": Decimal("0.45359237"),
    "oz": Decimal("0.028349523125"),
}
_WEIGHT = re.compile(r"^\s*([0-9]+(?:[.,][0-9]+)?)\s*([a-z]*)\s*$")


class Unreadable(ValueError):
    """A row's value could not be read; the row is rejected with this reason."""


def canonical_key(key: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", key.strip().lower()).strip("_")


def pick(row: dict[str, Any], field: str) -> Any:
    keys = {canonical_key(k): v for k, v in row.items()}
    return next((keys[a] for a in ALIASES[field] if keys.get(a) not in (None, "")), None)


def parse_price(value: Any) -> tuple[int, str]:
    """(cents, currency); a bare number is in US dollars."""
    if isinstance(value, bool):
        raise Unreadable("price is not a number")
    if isinstance(value, int | float):
        amount, currency = Decimal(str(value)), "USD"
    else:
        text = str(value).strip().upper()
        currency = next((c for s, c in CURRENCY_SYMBOLS.items() if s in text), None)
        currency = currency or next((c for c in CURRENCY_CODES if c in text), "USD")
        digits = re.sub(r"[^0-9.,]", "", text)
        if "," in digits and "." not in digits:
            digits = digits.replace(",", ".")  # a decimal comma: "12,50"
        digits = digits.replace(",", "")  # thousands separators: "1,299.00"
        try:
            amount = Decimal(digits)
        except InvalidOperation:
            raise Unreadable(f"unreadable price {value!r}") from None
    if amount < 0:
        raise Unreadable(f"negative price {value!r}")
    return int((amount * 100).quantize(Decimal(1), rounding=ROUND_HALF_UP)), currency


def parse_weight_kg(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        kilograms = Decimal(str(value))
    else:
        match = _WEIGHT.match(str(value).lower())
        if not match or (match[2] or "kg") not in KG_PER_UNIT:
            raise Unreadable(f"unreadable weight {value!r}")
        kilograms = Decimal(match[1].replace(",", ".")) * KG_PER_UNIT[match[2] or "kg"]
    return float(kilograms.quantize(Decimal("0.001"), rounding=ROUND_HALF_UP))


def canonical_category(text: Any) -> str:
    lowered = str(text or "").lower()
    return next((cat for word, cat in CATEGORY_KEYWORDS if word in lowered), "other")


def normalise_row(row: dict[str, Any]) -> dict[str, Any]:
    sku = pick(row, "sku")
    if sku is None:
        raise Unreadable("no sku")
    price = pick(row, "price")
    if price is None:
        raise Unreadable("no price")
    cents, currency = parse_price(price)
    brand = " ".join(str(pick(row, "brand") or "").split()).title() or None
    return {
        "sku": re.sub(r"\s+", "", str(sku)).upper(),
        "brand": brand,
        "description": " ".join(str(pick(row, "description") or "").split()) or None,
        "category": canonical_category(pick(row, "category")),
        "price_cents": cents,
        "currency": currency,
        "weight_kg": parse_weight_kg(pick(row, "weight")),
        # Technical attributes (rotor diameter, thread, ...) pass through as given,
        # for the agents after this one (FitmentAgent matches on them).
        "attributes": attributes if isinstance(attributes := pick(row, "attributes"), dict) else {},
    }


@register
class SupplierNormalizationAgent(Agent):
    name = "SupplierNormalizationAgent"
    task_types = ("normalize_supplier_feed",)
    description = "Normalises a supplier feed into canonical part records."

    def handle(self, task: TaskContext) -> dict[str, Any]:
        supplier = require(task.payload, "supplier", str)
        items = require(task.payload, "items", list)
        records: list[dict[str, Any]] = []
        rejected: list[dict[str, Any]] = []
        seen: set[str] = set()
        duplicates = 0
        for index, row in enumerate(items):
            if not isinstance(row, dict):
                rejected.append({"row": index, "reason": "not an object"})
                continue
            try:
                record = normalise_row(row)
            except Unreadable as reason:
                rejected.append({"row": index, "reason": str(reason)})
                continue
            if record["sku"] in seen:
                duplicates += 1
                continue
            seen.add(record["sku"])
            records.append(record)
        return {
            "supplier": supplier.strip(),
            "records": records,
            "rejected": rejected,
            "duplicates": duplicates,
            "counts": {"in": len(items), "out": len(records), "rejected": len(rejected)},
        }

    def describe(self, task: TaskContext, result: dict[str, Any]) -> str:
        counts = result["counts"]
        return (
            f"SupplierNormalizationAgent normalised {counts['out']} of {counts['in']} rows "
            f"from {result['supplier']} ({counts['rejected']} rejected, "
            f"{result['duplicates']} duplicates)"
        )
