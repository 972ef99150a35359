"""A stream of realistic supplier feeds for ``manage.py up --demo``.

About one item in six carries a spec the fitment agent refuses (a brake part for
the "middle" axle, a bolt pattern with a dash), so its fitment task fails
permanently and lands in the dead letter, where an operator can fix the payload and
revive it.
"""

from __future__ import annotations

import random
from typing import Any

SUPPLIERS = ["Acme Parts", "Northwind Auto", "Globex Brakes", "Initech Wheels"]
BRANDS = ["brembo", "akebono", "enkei", "bosch", "ate", "textar"]


def _rotor(rng: random.Random, broken: bool) -> dict[str, Any]:
    diameter = rng.choice([280, 300, 305, 320, 345])
    position = "middle" if broken else rng.choice(["front", "rear"])
    return {
        "Part No": f"rtr-{diameter}{position[0]}-{rng.randrange(1000)}",
        "Brand": rng.choice(BRANDS),
        "Price": f"${rng.uniform(25, 140):.2f}",
        "Weight": f"{rng.uniform(5, 15):.1f} lb",
        "Category": "Disc Rotor",
        "Desc": f"{position.title()} brake rotor {diameter} mm",
        "Specs": {"diameter_mm": diameter, "position": position},
    }


def _wheel(rng: random.Random, broken: bool) -> dict[str, Any]:
    inches = rng.choice([15, 16, 17, 18, 19])
    pattern = "5-114.3" if broken else rng.choice(["5x114.3", "5x112", "4x100"])
    return {
        "Part No": f"whl-{inches}-{rng.randrange(1000)}",
        "Brand": rng.choice(BRANDS),
        "Price": f"${rng.uniform(80, 400):.0f}",
        "Weight": f"{rng.uniform(7, 12):.1f} kg",
        "Category": "Alloy wheel",
        "Desc": f"Alloy wheel {inches}in",
        "Specs": {"bolt_pattern": pattern, "diameter_in": inches},
    }


def demo_feed(rng: random.Random, *, broken_share: float = 1 / 6) -> dict[str, Any]:
    """A supplier feed of 2–5 parts for the ``supplier_onboarding`` definition."""
    items = [
        rng.choice([_rotor, _wheel])(rng, rng.random() < broken_share)
        for _ in range(rng.randint(2, 5))
    ]
    return {"supplier": rng.choice(SUPPLIERS), "items": items}
