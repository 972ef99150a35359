"""The part categories the agents share, with the labels shoppers see."""

CATEGORY_LABELS = {
    "brake_rotor": "Brake Rotor",
    "brake_pads": "Brake Pads",
    "wheel": "Wheel",
    "oil_filter": "Oil Filter",
    "spark_plug": "Spark Plug",
    "other": "Auto Part",
}
CATEGORIES = tuple(CATEGORY_LABELS)
