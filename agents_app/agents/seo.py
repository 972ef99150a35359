"""SEOAgent: the title, description, slug, keywords and schema.org data of a part's page.

Payload::

    {"product": {"sku": "RTR-305F", "brand": "Brembo", "name": "Premium Brake Rotor",
                 "category": "brake_rotor", "attributes": {"diameter_mm": 305},
                 "fitment": [{"make": "Toyota", "model": "Camry", "years": "2018-2024"}]}}

``fitment`` takes FitmentAgent's ``vehicles`` as they are. The title stays within 60
characters and the description within 155, cut on a word boundary.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from task_queue.agent import Agent, InvalidPayload, TaskContext, require
from task_queue.registry import register

from ..parts import CATEGORY_LABELS

TITLE_MAX = 60
DESCRIPTION_MAX = 155


def shorten(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters, cut on a word boundary, "…" when cut."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    if text[limit - 1] != " ":  # the cut fell inside a word: drop that word
        cut = cut.rsplit(" ", 1)[0]
    return cut.rstrip(" ,;:-–") + "…"


def slugify(text: str) -> str:
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9]+", "-", ascii_text.lower()).strip("-")


def vehicle_names(fitment: list[dict[str, Any]]) -> list[str]:
    """Distinct "Make Model" names, in first-seen order."""
    return list(dict.fromkeys(f"{v['make']} {v['model']}" for v in fitment))


def read_product(payload: dict[str, Any]) -> dict[str, Any]:
    product = require(payload, "product", dict)
    for field in ("sku", "brand", "name"):
        if not isinstance(product.get(field), str) or not product[field].strip():
            raise InvalidPayload(f"product.{field}", "must be a non-empty string")
    category = product.get("category", "other")
    if category not in CATEGORY_LABELS:
        raise InvalidPayload("product.category", f"must be one of {', '.join(CATEGORY_LABELS)}")
    attributes = product.get("attributes", {})
    if not isinstance(attributes, dict):
        raise InvalidPayload("product.attributes", "must be an object")
    fitment = product.get("fitment", [])
    if not isinstance(fitment, list) or not all(
        isinstance(v, dict) and isinstance(v.get("make"), str) and isinstance(v.get("model"), str)
        for v in fitment
    ):
        raise InvalidPayload("product.fitment", "must be a list of {make, model} objects")
    return {**product, "category": category, "attributes": attributes, "fitment": fitment}


@register
class SEOAgent(Agent):
    name = "SEOAgent"
    task_types = ("generate_seo", "refresh_seo")
    description = "Writes a part page's title, meta description, slug and structured data."

    def handle(self, task: TaskContext) -> dict[str, Any]:
        product = read_product(task.payload)
        sku, brand, name = (product[f].strip() for f in ("sku", "brand", "name"))
        label = CATEGORY_LABELS[product["category"]]
        vehicles = vehicle_names(product["fitment"])

        title = f"{brand} {name}" + (f" for {vehicles[0]}" if len(vehicles) == 1 else "")
        fits = ""
        if vehicles:
            shown = ", ".join(vehicles[:3])
            others = len(vehicles) - 3
            fits = f" Fits {shown}" + (f" and {others} more" if others > 0 else "") + "."
        description = f"{brand} {name} ({label.lower()}), part number {sku}.{fits}"
        keywords = list(
            dict.fromkeys(
                k.lower() for k in [brand, name, label, sku, *(f"{v} {label}" for v in vehicles)]
            )
        )
        return {
            "sku": sku,
            "title": shorten(title, TITLE_MAX),
            "meta_description": shorten(description, DESCRIPTION_MAX),
            "slug": slugify(f"{brand} {name} {sku}"),
            "keywords": keywords,
            "structured_data": {
                "@context": "https://schema.org",
                "@type": "Product",
                "name": f"{brand} {name}",
                "sku": sku,
                "brand": {"@type": "Brand", "name": brand},
                "category": label,
                "additionalProperty": [
                    {"@type": "PropertyValue", "name": key, "value": value}
                    for key, value in sorted(product["attributes"].items())
                ],
            },
        }

    def describe(self, task: TaskContext, result: dict[str, Any]) -> str:
        return f"SEOAgent wrote the page for {result['sku']}: {result['title']}"
