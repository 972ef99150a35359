"""FitmentAgent: which vehicles a part fits, from the bundled vehicle catalogue.

Payload::

    {"part": {"sku": "RTR-305F", "category": "brake_rotor",
              "attributes": {"diameter_mm": 305, "position": "front"}},
     "make": "Toyota",   # optional: only this make
     "year": 2020}       # optional: only vehicles built that year

What each category is matched on:

- ``wheel``: ``bolt_pattern`` ("5x114.3") and ``diameter_in`` (17);
- ``brake_rotor`` and ``brake_pads``: ``diameter_mm`` and ``position`` (front/rear);
- ``oil_filter`` and ``spark_plug``: ``thread`` ("M20x1.5").

Result: the sku, category, the attributes matched on, and the vehicles (make,
model, years, engine), sorted by make, model, first year and engine.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from task_queue.agent import Agent, InvalidPayload, TaskContext, require
from task_queue.registry import register

from ..parts import CATEGORY_LABELS

CATALOGUE = Path(__file__).resolve().parent.parent / "data" / "vehicles.json"


@cache
def vehicles() -> tuple[dict[str, Any], ...]:
    return tuple(json.loads(CATALOGUE.read_text()))


def _rotor_field(attributes: dict[str, Any]) -> str:
    position = attributes.get("position")
    if position not in ("front", "rear"):
        raise InvalidPayload("part.attributes.position", 'must be "front" or "rear"')
    return f"{position}_rotor_mm"


def _number(attributes: dict[str, Any], key: str) -> float:
    value = attributes.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise InvalidPayload(f"part.attributes.{key}", "must be a positive number")
    return value


def _thread(attributes: dict[str, Any]) -> str:
    value = attributes.get("thread")
    if not isinstance(value, str) or not value.startswith("M") or "x" not in value:
        raise InvalidPayload("part.attributes.thread", 'must be a metric thread like "M20x1.5"')
    return value


def _bolt_pattern(attributes: dict[str, Any]) -> str:
    value = attributes.get("bolt_pattern")
    lugs, _, circle = value.partition("x") if isinstance(value, str) else ("", "", "")
    if not (lugs.isdigit() and circle.replace(".", "", 1).isdigit()):
        raise InvalidPayload("part.attributes.bolt_pattern", 'must look like "5x114.3"')
    return value


def criteria(category: str, attributes: dict[str, Any]) -> dict[str, Any]:
    """Catalogue field → required value, for a part of ``category``."""
    if category == "wheel":
        return {
            "bolt_pattern": _bolt_pattern(attributes),
            "wheel_diameters_in": _number(attributes, "diameter_in"),
        }
    if category in ("brake_rotor", "brake_pads"):
        return {_rotor_field(attributes): _number(attributes, "diameter_mm")}
    if category == "oil_filter":
        return {"oil_filter_thread": _thread(attributes)}
    if category == "spark_plug":
        return {"spark_plug_thread": _thread(attributes)}
    fitted = "brake_rotor, brake_pads, wheel, oil_filter, spark_plug"
    raise InvalidPayload("part.category", f"must be one of {fitted}")


def fits(vehicle: dict[str, Any], wanted: dict[str, Any]) -> bool:
    for field, value in wanted.items():
        have = vehicle[field]
        if not (value in have if isinstance(have, list) else have == value):
            return False
    return True


@register
class FitmentAgent(Agent):
    name = "FitmentAgent"
    task_types = ("generate_fitment",)
    description = "Matches a part's attributes against the vehicle catalogue."

    def handle(self, task: TaskContext) -> dict[str, Any]:
        part = require(task.payload, "part", dict)
        sku = part.get("sku")
        if not isinstance(sku, str) or not sku.strip():
            raise InvalidPayload("part.sku", "must be a non-empty string")
        category = part.get("category")
        attributes = part.get("attributes")
        if not isinstance(attributes, dict):
            raise InvalidPayload("part.attributes", "must be an object")
        wanted = criteria(category, attributes)
        make = task.payload.get("make")
        if make is not None and not isinstance(make, str):
            raise InvalidPayload("make", "must be a string")
        year = task.payload.get("year")
        if year is not None and (isinstance(year, bool) or not isinstance(year, int)):
            raise InvalidPayload("year", "must be an integer")

        matches = [
            v
            for v in vehicles()
            if fits(v, wanted)
            and (make is None or v["make"].lower() == make.lower())
            and (year is None or v["years"][0] <= year <= v["years"][1])
        ]
        matches.sort(key=lambda v: (v["make"], v["model"], v["years"][0], v["engine"]))
        return {
            "sku": sku.strip(),
            "category": category,
            "matched_on": sorted(wanted),
            "count": len(matches),
            "vehicles": [
                {
                    "make": v["make"],
                    "model": v["model"],
                    "years": f"{v['years'][0]}-{v['years'][1]}",
                    "engine": v["engine"],
                }
                for v in matches
            ],
        }

    def describe(self, task: TaskContext, result: dict[str, Any]) -> str:
        label = CATEGORY_LABELS[result["category"]].lower()
        if not result["count"]:
            return f"FitmentAgent found no vehicle for {label} {result['sku']}"
        names = [f"{v['make']} {v['model']} {v['years']}" for v in result["vehicles"][:3]]
        more = f" and {result['count'] - 3} more" if result["count"] > 3 else ""
        return (
            f"FitmentAgent matched {label} {result['sku']} to {result['count']} vehicles: "
            + ", ".join(names)
            + more
        )
