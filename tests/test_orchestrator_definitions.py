"""The reference orchestrator's definitions: templates, the checks a definition must
pass, and which steps a plan enqueues as the steps before them complete."""

from __future__ import annotations

import json

import pytest

from tests.test_orchestrator import DEFINITIONS, FEED
from workflows.orchestrator.definitions import DefinitionError, load_all, parse, render
from workflows.orchestrator.driver import plan


def test_render_references_map_and_index():
    context = {
        "input": {"supplier": "Acme", "rows": [1, 2]},
        "steps": {"fit": {"results": [{"v": ["a"]}, {"v": ["b"]}], "result": None}},
        "item": {"sku": "X"},
        "index": 1,
    }
    template = {
        "supplier": "$input.supplier",
        "first": "$input.rows.0",
        "vehicles": "$steps.fit.results.$index.v",
        "sku": "$item.sku",
        "n": "$index",
        "literal": "$$5",
        "doubled": {"$map": "$input.rows", "to": {"row": "$item", "at": "$index"}},
    }
    assert render(template, context) == {
        "supplier": "Acme",
        "first": 1,
        "vehicles": ["b"],
        "sku": "X",
        "n": 1,
        "literal": "$5",
        "doubled": [{"row": 1, "at": 0}, {"row": 2, "at": 1}],
    }
    with pytest.raises(DefinitionError, match=r"\$input.nope: nothing at 'nope'"):
        render("$input.nope", context)


def test_definitions_are_checked():
    step = {"name": "a", "agent_name": "EchoAgent", "task_type": "echo"}
    with pytest.raises(DefinitionError, match="not listed before it"):
        parse({"name": "d", "steps": [{**step, "depends_on": ["b"]}]})
    with pytest.raises(DefinitionError, match="unknown keys"):
        parse({"name": "d", "steps": [{**step, "retries": 3}]})
    with pytest.raises(DefinitionError, match="unique"):
        parse({"name": "d", "steps": [step, step]})
    assert set(load_all(DEFINITIONS)) == {"supplier_onboarding", "flaky_onboarding"}


def test_plan_enqueues_each_step_once_its_dependencies_complete():
    definition = load_all()["supplier_onboarding"]
    feed = json.loads(FEED.read_text())
    first = plan(definition, "r", feed, [])
    assert [t["idempotency_key"] for t in first.new_tasks] == ["wf:r:normalize"]
    assert not first.complete

    records = [
        {
            "sku": s,
            "category": "wheel",
            "attributes": {},
            "price_cents": 100,
            "brand": "B",
            "description": "D",
        }
        for s in ("A", "B")
    ]
    normalize = {
        "idempotency_key": "wf:r:normalize",
        "status": "completed",
        "result": {"records": records},
    }
    second = plan(definition, "r", feed, [normalize])
    assert [t["idempotency_key"] for t in second.new_tasks] == ["wf:r:fitment:0", "wf:r:fitment:1"]
    assert second.new_tasks[1]["payload"]["part"]["sku"] == "B"

    fitment = [
        {"idempotency_key": f"wf:r:fitment:{i}", "status": "completed", "result": {"vehicles": [i]}}
        for i in range(2)
    ]
    pending = plan(definition, "r", feed, [normalize, {**fitment[0], "status": "running"}])
    assert [t["idempotency_key"] for t in pending.new_tasks] == ["wf:r:fitment:1"]
    third = plan(definition, "r", feed, [normalize, *fitment])
    (pricing,) = third.new_tasks
    assert pricing["payload"]["items"] == [
        {"sku": "A", "cost_cents": 100, "category": "wheel"},
        {"sku": "B", "cost_cents": 100, "category": "wheel"},
    ]
    done = {"idempotency_key": "wf:r:pricing", "status": "completed", "result": {}}
    fourth = plan(definition, "r", feed, [normalize, *fitment, done])
    assert [t["payload"]["product"]["fitment"] for t in fourth.new_tasks] == [[0], [1]]
    assert fourth.complete
