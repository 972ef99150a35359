"""The AutoMechanica agents' logic on their payloads (no database needed)."""

import uuid

import pytest

from task_queue.agent import InvalidPayload, TaskContext
from task_queue.registry import get


def run(agent, task_type, payload):
    task = TaskContext(
        id=uuid.uuid4(),
        agent_name=agent,
        task_type=task_type,
        payload=payload,
        attempt=0,
        max_attempts=3,
    )
    instance = get(agent)()
    result = instance.handle(task)
    return result, instance.describe(task, result)


def invalid_field(agent, task_type, payload):
    with pytest.raises(InvalidPayload) as error:
        run(agent, task_type, payload)
    return error.value.field


# ---------------------------------------------------------------- FitmentAgent


def fitment(part, **filters):
    return run("FitmentAgent", "generate_fitment", {"part": part, **filters})


def test_fitment_matches_front_rotor_diameter():
    result, summary = fitment(
        {
            "sku": " RTR-305F ",
            "category": "brake_rotor",
            "attributes": {"diameter_mm": 305, "position": "front"},
        }
    )
    assert result["sku"] == "RTR-305F"
    assert result["matched_on"] == ["front_rotor_mm"]
    assert [(v["make"], v["model"], v["years"]) for v in result["vehicles"]] == [
        ("Toyota", "Camry", "2018-2024"),
        ("Toyota", "RAV4", "2019-2024"),
    ]
    assert summary == (
        "FitmentAgent matched brake rotor RTR-305F to 2 vehicles: "
        "Toyota Camry 2018-2024, Toyota RAV4 2019-2024"
    )


def test_fitment_wheel_by_bolt_pattern_diameter_and_year():
    part = {
        "sku": "WHL-19",
        "category": "wheel",
        "attributes": {"bolt_pattern": "5x112", "diameter_in": 19},
    }
    result, _ = fitment(part, year=2016)
    assert [(v["make"], v["model"]) for v in result["vehicles"]] == [
        ("Mercedes-Benz", "C-Class"),
        ("Volkswagen", "Golf GTI"),
    ]
    assert fitment(part, year=2016, make="volkswagen")[0]["count"] == 1
    assert fitment(part)[0]["count"] == 6  # all years: + Tiguan, 3 Series, X5, A4


def test_fitment_oil_filter_thread_and_no_match():
    result, _ = fitment(
        {"sku": "OF-18", "category": "oil_filter", "attributes": {"thread": "M18x1.5"}}
    )
    assert {v["make"] for v in result["vehicles"]} == {"Audi", "BMW", "Mercedes-Benz", "Volkswagen"}
    none, summary = fitment(
        {"sku": "SP-10", "category": "spark_plug", "attributes": {"thread": "M10x1.0"}}
    )
    assert none["count"] == 0
    assert summary == "FitmentAgent found no vehicle for spark plug SP-10"


@pytest.mark.parametrize(
    ("part", "field"),
    [
        ({"category": "wheel", "attributes": {}}, "part.sku"),
        ({"sku": "X", "category": "wiper", "attributes": {}}, "part.category"),
        ({"sku": "X", "category": "wheel", "attributes": "big"}, "part.attributes"),
        (
            {
                "sku": "X",
                "category": "wheel",
                "attributes": {"bolt_pattern": "five", "diameter_in": 17},
            },
            "part.attributes.bolt_pattern",
        ),
        (
            {
                "sku": "X",
                "category": "brake_pads",
                "attributes": {"diameter_mm": 300, "position": "middle"},
            },
            "part.attributes.position",
        ),
        (
            {
                "sku": "X",
                "category": "brake_rotor",
                "attributes": {"diameter_mm": "300", "position": "rear"},
            },
            "part.attributes.diameter_mm",
        ),
        (
            {"sku": "X", "category": "oil_filter", "attributes": {"thread": "20mm"}},
            "part.attributes.thread",
        ),
    ],
)
def test_fitment_invalid_payload_names_the_field(part, field):
    assert invalid_field("FitmentAgent", "generate_fitment", {"part": part}) == field


def test_fitment_requires_a_part():
    assert invalid_field("FitmentAgent", "generate_fitment", {}) == "part"


# ---------------------------------------------------------------- SupplierNormalizationAgent

FEED = [
    {
        "Part No": " rtr-305f ",
        "Brand": "  brembo ",
        "Price": "$54.90",
        "Weight": "12.5 lb",
        "Category": "Disc Rotor",
        "Desc": " Front  rotor ",
        "Specs": {"diameter_mm": 305, "position": "front"},
    },
    {"sku": "RTR-305F", "price": 1},
    {"part_number": "pad-1", "price": "12,50 EUR", "wt": "40 oz", "type": "Ceramic brake pads"},
    {"SKU": "plug-7", "Unit Price": 1299.5, "Shipping Weight": 0.05, "Product Type": "Spark plug"},
    {"brand": "x", "price": "3"},
    {"sku": "A1", "price": "abc"},
    [1],
]


def test_supplier_feed_is_normalised():
    result, summary = run(
        "SupplierNormalizationAgent",
        "normalize_supplier_feed",
        {"supplier": " Acme ", "items": FEED},
    )
    assert result["records"] == [
        {
            "sku": "RTR-305F",
            "brand": "Brembo",
            "description": "Front rotor",
            "category": "brake_rotor",
            "price_cents": 5490,
            "currency": "USD",
            "weight_kg": 5.67,
            "attributes": {"diameter_mm": 305, "position": "front"},
        },
        {
            "sku": "PAD-1",
            "brand": None,
            "description": None,
            "category": "brake_pads",
            "price_cents": 1250,
            "currency": "EUR",
            "weight_kg": 1.134,
            "attributes": {},
        },
        {
            "sku": "PLUG-7",
            "brand": None,
            "description": None,
            "category": "spark_plug",
            "price_cents": 129950,
            "currency": "USD",
            "weight_kg": 0.05,
            "attributes": {},
        },
    ]
    assert result["rejected"] == [
        {"row": 4, "reason": "no sku"},
        {"row": 5, "reason": "unreadable price 'abc'"},
        {"row": 6, "reason": "not an object"},
    ]
    assert result["duplicates"] == 1
    assert summary == (
        "SupplierNormalizationAgent normalised 3 of 7 rows from Acme (3 rejected, 1 duplicates)"
    )


def test_supplier_price_formats():
    from agents_app.agents.supplier import parse_price, parse_weight_kg

    assert parse_price("£1,299.00") == (129900, "GBP")
    assert parse_price("EUR 9,99") == (999, "EUR")
    assert parse_price(12) == (1200, "USD")
    assert parse_weight_kg("500 g") == 0.5
    assert parse_weight_kg(None) is None


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"supplier": "Acme"}, "items"),
        ({"supplier": "Acme", "items": {}}, "items"),
        ({"items": []}, "supplier"),
    ],
)
def test_supplier_invalid_payload_names_the_field(payload, field):
    assert invalid_field("SupplierNormalizationAgent", "normalize_supplier_feed", payload) == field


# ---------------------------------------------------------------- PricingAgent


def test_pricing_rules_each_decide_one_item():
    result, summary = run(
        "PricingAgent",
        "price_parts",
        {
            "items": [
                {
                    "sku": "A",
                    "cost_cents": 3000,
                    "category": "brake_rotor",
                    "competitor_prices_cents": [5499, 5999, 6499],
                },
                {"sku": "B", "cost_cents": 3000, "competitor_prices_cents": [3100]},
                {"sku": "C", "cost_cents": 2000, "competitor_prices_cents": [2800, 2900]},
                {"sku": "D", "cost_cents": 1234},
            ],
            "rules": {"target_margin_pct": {"brake_rotor": 40, "default": 35}},
        },
    )
    # A: 3000 / 0.60 = 5000, under the cap 5999 × 1.10 = 6598 → 50.99.
    # B: 3000 / 0.65 → 4616, over the cap 3100 × 1.10 = 3410, under the floor
    #    3000 / 0.85 → 3530 → 35.99.
    # C: 2000 / 0.65 → 3077, under the cap 2850 × 1.10 = 3135 → 30.99.
    # D: 1234 / 0.65 → 1899 → 18.99.
    assert [(i["sku"], i["price_cents"], i["rule"], i["margin_pct"]) for i in result["items"]] == [
        ("A", 5099, "target_margin", 41.2),
        ("B", 3599, "margin_floor", 16.6),
        ("C", 3099, "target_margin", 35.5),
        ("D", 1899, "target_margin", 35.0),
    ]
    assert result["items"][0]["competitor_median_cents"] == 5999
    assert summary == "PricingAgent priced 4 parts: A at 50.99, B at 35.99, C at 30.99 and 1 more"


def test_pricing_competitor_cap():
    result, _ = run(
        "PricingAgent",
        "price_parts",
        {
            "items": [{"sku": "E", "cost_cents": 2000, "competitor_prices_cents": [2500, 2700]}],
        },
    )
    # Target 3077; median 2600 × 1.10 = 2860 caps it; floor 2353 is below → 28.99.
    assert result["items"][0]["price_cents"] == 2899
    assert result["items"][0]["rule"] == "competitor_cap"


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"items": []}, "items"),
        ({"items": [{"sku": "A", "cost_cents": 0}]}, "items[0].cost_cents"),
        ({"items": [{"cost_cents": 10}]}, "items[0].sku"),
        (
            {"items": [{"sku": "A", "cost_cents": 10, "competitor_prices_cents": ["9"]}]},
            "items[0].competitor_prices_cents",
        ),
        (
            {"items": [{"sku": "A", "cost_cents": 10}], "rules": {"min_margin_pct": 100}},
            "rules.min_margin_pct",
        ),
        (
            {
                "items": [{"sku": "A", "cost_cents": 10}],
                "rules": {"target_margin_pct": {"wheel": 30}},
            },
            "rules.target_margin_pct",
        ),
    ],
)
def test_pricing_invalid_payload_names_the_field(payload, field):
    assert invalid_field("PricingAgent", "price_parts", payload) == field


# ---------------------------------------------------------------- SEOAgent

PRODUCT = {
    "sku": "RTR-305F",
    "brand": "Brembo",
    "name": "Premium Brake Rotor",
    "category": "brake_rotor",
    "attributes": {"position": "front", "diameter_mm": 305},
}


def test_seo_page_for_a_part_fitting_one_vehicle():
    product = {**PRODUCT, "fitment": [{"make": "Toyota", "model": "Camry", "years": "2018-2024"}]}
    result, summary = run("SEOAgent", "generate_seo", {"product": product})
    assert result["title"] == "Brembo Premium Brake Rotor for Toyota Camry"
    assert result["meta_description"] == (
        "Brembo Premium Brake Rotor (brake rotor), part number RTR-305F. Fits Toyota Camry."
    )
    assert result["slug"] == "brembo-premium-brake-rotor-rtr-305f"
    assert result["keywords"] == [
        "brembo",
        "premium brake rotor",
        "brake rotor",
        "rtr-305f",
        "toyota camry brake rotor",
    ]
    assert result["structured_data"]["additionalProperty"] == [
        {"@type": "PropertyValue", "name": "diameter_mm", "value": 305},
        {"@type": "PropertyValue", "name": "position", "value": "front"},
    ]
    assert summary == "SEOAgent wrote the page for RTR-305F: " + result["title"]


def test_seo_shortens_on_word_boundaries_and_slugifies_accents():
    product = {
        "sku": "WHL-1",
        "brand": "Škoda Motorsport",
        "category": "wheel",
        "name": "Lightweight Forged Alloy Racing Wheel With Extra Long Name Here",
        "fitment": [{"make": m, "model": f"Model {i}"} for i, m in enumerate("ABCDE")],
    }
    result, _ = run("SEOAgent", "generate_seo", {"product": product})
    assert len(result["title"]) <= 60 and result["title"].endswith("…")
    assert result["title"] == "Škoda Motorsport Lightweight Forged Alloy Racing Wheel With…"
    assert len(result["meta_description"]) <= 155
    assert result["meta_description"] == (
        "Škoda Motorsport Lightweight Forged Alloy Racing Wheel With Extra Long Name Here "
        "(wheel), part number WHL-1. Fits A Model 0, B Model 1, C Model 2 and 2…"
    )
    assert result["slug"].startswith("skoda-motorsport-lightweight-")


@pytest.mark.parametrize(
    ("product", "field"),
    [
        ({**PRODUCT, "sku": ""}, "product.sku"),
        ({**PRODUCT, "brand": None}, "product.brand"),
        ({**PRODUCT, "category": "wipers"}, "product.category"),
        ({**PRODUCT, "fitment": [{"make": "Toyota"}]}, "product.fitment"),
        ({**PRODUCT, "attributes": []}, "product.attributes"),
    ],
)
def test_seo_invalid_payload_names_the_field(product, field):
    assert invalid_field("SEOAgent", "generate_seo", {"product": product}) == field
