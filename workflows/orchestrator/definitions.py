"""Workflow definitions written as data (JSON), and the templates that feed each step
the workflow's input and the results of the steps before it.

A definition::

    {"name": "supplier_onboarding",
     "steps": [
       {"name": "normalize", "agent_name": "SupplierNormalizationAgent",
        "task_type": "normalize_supplier_feed",
        "payload": {"supplier": "$input.supplier", "items": "$input.items"}},
       {"name": "fitment", "depends_on": ["normalize"],
        "for_each": "$steps.normalize.result.records", ...,
        "payload": {"part": {"sku": "$item.sku", "attributes": "$item.attributes"}}}]}

In a payload template, a string starting with ``$`` is a reference:

- ``$input.a.b``: the workflow's input;
- ``$steps.NAME.result.x``: the result of step NAME (a step with one task);
- ``$steps.NAME.results``: the results of a ``for_each`` step's tasks, in item order;
- ``$item.x`` and ``$index``: the current item of a ``for_each`` step, and its index;
  ``$index`` may also stand as a path segment (``$steps.fitment.results.$index``).

A path segment that is a number indexes a list. ``{"$map": REF, "to": TEMPLATE}``
makes a list, TEMPLATE rendered once per element of REF with ``$item``/``$index``
bound. ``$$`` at the start of a string stands for a literal ``$``.

A step with ``for_each`` becomes one task per element of that list; steps run when
every step in ``depends_on`` has completed. Steps may depend only on steps listed
before them, so the order in the file is an order in which they can run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BUILT_IN = Path(__file__).resolve().parent / "definitions"


class DefinitionError(ValueError):
    """A definition or a reference in it is invalid."""


@dataclass(frozen=True)
class Step:
    name: str
    agent_name: str
    task_type: str
    payload: Any = field(default_factory=dict)
    depends_on: tuple[str, ...] = ()
    for_each: str | None = None
    priority: int | None = None
    max_attempts: int | None = None


# A definition's own settings beside its steps: its workflows' escalation thresholds
# (POST /api/v1/workflows, task_queue.escalation), each a positive whole number.
ESCALATION_KEYS = ("escalate_after_failures", "escalate_after_seconds")


@dataclass(frozen=True)
class Definition:
    name: str
    steps: tuple[Step, ...]
    escalate_after_failures: int | None = None
    escalate_after_seconds: int | None = None

    def escalation(self) -> dict[str, int]:
        """The thresholds it sets, as the API takes them."""
        return {key: getattr(self, key) for key in ESCALATION_KEYS if getattr(self, key)}

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "steps": [
                {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(s).items()}
                for s in self.steps
            ],
            **self.escalation(),
        }


def parse(data: Any) -> Definition:
    """A definition from its JSON form; raises :class:`DefinitionError`."""
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        raise DefinitionError("a definition is an object with a name and steps")
    raw_steps = data.get("steps")
    if not isinstance(raw_steps, list) or not raw_steps:
        raise DefinitionError(f"{data['name']}: steps must be a non-empty list")
    known = {
        "name",
        "agent_name",
        "task_type",
        "payload",
        "depends_on",
        "for_each",
        "priority",
        "max_attempts",
    }
    steps: list[Step] = []
    for raw in raw_steps:
        if not isinstance(raw, dict) or not {"name", "agent_name", "task_type"} <= raw.keys():
            raise DefinitionError(f"{data['name']}: each step needs name, agent_name, task_type")
        if unknown := set(raw) - known:
            raise DefinitionError(f"step {raw['name']}: unknown keys {sorted(unknown)}")
        earlier = {s.name for s in steps}
        if raw["name"] in earlier or ":" in raw["name"]:
            raise DefinitionError(f"step {raw['name']}: names must be unique, without ':'")
        depends_on = tuple(raw.get("depends_on", ()))
        if missing := [d for d in depends_on if d not in earlier]:
            raise DefinitionError(f"step {raw['name']}: depends on {missing}, not listed before it")
        steps.append(Step(**{**raw, "depends_on": depends_on}))
    if unknown := set(data) - {"name", "steps", *ESCALATION_KEYS}:
        raise DefinitionError(f"{data['name']}: unknown keys {sorted(unknown)}")
    escalation = {key: data[key] for key in ESCALATION_KEYS if data.get(key) is not None}
    for key, value in escalation.items():
        if type(value) is not int or value < 1:
            raise DefinitionError(f"{data['name']}: {key} must be a positive whole number")
    return Definition(data["name"], tuple(steps), **escalation)


def load_all(*directories: Path) -> dict[str, Definition]:
    """Every ``*.json`` definition in the built-in folder and ``directories``, by name."""
    definitions = {}
    for directory in (BUILT_IN, *directories):
        for path in sorted(Path(directory).glob("*.json")):
            definition = parse(json.loads(path.read_text()))
            definitions[definition.name] = definition
    return definitions


def render(template: Any, context: dict[str, Any]) -> Any:
    """``template`` with every reference replaced by its value in ``context``
    (keys ``input``, ``steps``, and inside a for_each or $map ``item`` and ``index``)."""
    if isinstance(template, str):
        if template.startswith("$$"):
            return template[1:]
        if template.startswith("$"):
            return lookup(template, context)
        return template
    if isinstance(template, list):
        return [render(t, context) for t in template]
    if isinstance(template, dict):
        if "$map" in template:
            source = render(template["$map"], context)
            if not isinstance(source, list):
                raise DefinitionError(f"$map over {template['$map']}: not a list")
            return [
                render(template.get("to"), {**context, "item": item, "index": i})
                for i, item in enumerate(source)
            ]
        return {k: render(v, context) for k, v in template.items()}
    return template


def lookup(reference: str, context: dict[str, Any]) -> Any:
    if reference == "$index":
        return context.get("index")
    root, *path = reference[1:].split(".")
    if root not in context:
        raise DefinitionError(f"{reference}: unknown root {root!r}")
    value = context[root]
    for segment in path:
        if segment == "$index":
            segment = str(context.get("index"))
        if isinstance(value, list) and segment.isdigit() and int(segment) < len(value):
            value = value[int(segment)]
        elif isinstance(value, dict) and segment in value:
            value = value[segment]
        else:
            raise DefinitionError(f"{reference}: nothing at {segment!r}")
    return value
