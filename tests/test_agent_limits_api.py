"""Agents' limits through the API, the dashboard, the admin and /metrics."""

from __future__ import annotations

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from task_queue import limits, operations
from task_queue.models import AgentLimits, OperatorAction
from task_queue.sql import leasing
from tests.support.api import Api, field_names, token
from tests.support.users import staff

pytestmark = pytest.mark.django_db


def agent(api: Api, name: str = "EchoAgent") -> dict:
    return {a["name"]: a for a in api.get("/api/v1/agents").json()}[name]


def test_patch_sets_and_clears_limits_and_get_shows_their_use(admin_api):
    operations.enqueue_many([operations.TaskSpec("EchoAgent", "echo")] * 4)
    assert agent(admin_api)["concurrency_limit"] is None
    assert agent(admin_api)["rate_limit"] is None

    response = admin_api.patch(
        "/api/v1/agents/EchoAgent",
        {"concurrency_limit": 3, "rate_limit": {"count": 10, "period_seconds": 60}},
    )
    assert response.status_code == 200, response.json()
    assert response.json()["concurrency_limit"] == 3
    leasing.claim_tasks(owner="t:1", agents=["EchoAgent"], limit=10, lease_seconds=30, now=None)
    shown = agent(admin_api)
    assert shown["concurrency_limit"] == 3 and shown["concurrency_in_use"] == 3
    assert shown["rate_limit"] == {"count": 10, "period_seconds": 60}
    assert shown["rate_in_use"] == 3

    # A field left out stays; null clears.
    response = admin_api.patch("/api/v1/agents/EchoAgent", {"rate_limit": None})
    assert response.json()["rate_limit"] is None and response.json()["concurrency_limit"] == 3
    assert response.json()["rate_in_use"] is None
    admin_api.patch("/api/v1/agents/EchoAgent", {"concurrency_limit": None})
    assert not AgentLimits.objects.exists()
    assert agent(admin_api)["concurrency_in_use"] == 3  # shown with or without a limit

    actions = OperatorAction.objects.filter(action="limit")
    assert actions.count() == 3
    assert {a.actor for a in actions} == {"token:test-admin"}
    assert {a.source for a in actions} == {"api"}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"concurrency_limit": 0}, "concurrency_limit"),
        ({"concurrency_limit": -1}, "concurrency_limit"),
        ({"concurrency_limit": 10**9}, "concurrency_limit"),
        ({"concurrency_limit": "5"}, "concurrency_limit"),
        ({"concurrency_limit": 2.5}, "concurrency_limit"),
        ({"concurrency_limit": True}, "concurrency_limit"),
        ({"rate_limit": {"count": 0, "period_seconds": 60}}, "rate_limit.count"),
        ({"rate_limit": {"count": 5, "period_seconds": 0}}, "rate_limit.period_seconds"),
        ({"rate_limit": {"count": 5, "period_seconds": 10**9}}, "rate_limit.period_seconds"),
        ({"rate_limit": {"count": 5}}, "rate_limit.period_seconds"),
        ({"rate_limit": {"count": 5, "period_seconds": 60, "burst": 1}}, "rate_limit.burst"),
        ({"rate_limit": 5}, "rate_limit"),
        ({"concurrency": 5}, "concurrency"),
        ({}, "body"),
    ],
)
def test_bad_limits_are_refused_naming_the_field(admin_api, body, field):
    response = admin_api.patch("/api/v1/agents/EchoAgent", body)
    assert response.status_code == 422, response.json()
    assert field in field_names(response), response.json()
    assert not AgentLimits.objects.exists() and not OperatorAction.objects.exists()


def test_limits_need_an_admin_token_and_a_known_agent(admin_api):
    body = {"concurrency_limit": 2}
    assert Api(token("write")).patch("/api/v1/agents/EchoAgent", body).status_code == 403
    assert Api(None).patch("/api/v1/agents/EchoAgent", body).status_code == 401
    assert admin_api.patch("/api/v1/agents/NoSuchAgent", body).status_code == 404
    assert not AgentLimits.objects.exists()


def test_the_overview_shows_limits_and_the_operator_with_the_permission_edits_them():
    limits.set_limits(
        "EchoAgent",
        concurrency_limit=4,
        rate_limit=limits.RateLimit(30, 60),
        actor="user:test",
    )
    page = staff().get("/").content.decode()
    assert "0 / 4 running" in page and "0 / 30 per 60 s" in page
    assert "/agents/EchoAgent/limits/" not in page  # no permission, no link

    assert staff().post("/agents/EchoAgent/limits/", {"concurrency_limit": 1}).status_code == 403
    operator = staff("queue.limit_agent", username="ops")
    assert "/agents/EchoAgent/limits/" in operator.get("/").content.decode()
    form = operator.get("/agents/EchoAgent/limits/").content.decode()
    assert 'value="4"' in form and 'value="30"' in form

    refused = operator.post("/agents/EchoAgent/limits/", {"concurrency_limit": 0})
    assert refused.status_code == 400 and 'data-error="concurrency_limit"' in refused.text
    refused = operator.post("/agents/EchoAgent/limits/", {"rate_count": 5})
    assert refused.status_code == 400 and 'data-error="rate_period_seconds"' in refused.text

    saved = operator.post(
        "/agents/EchoAgent/limits/",
        {"concurrency_limit": 2, "rate_count": "", "rate_period_seconds": ""},
    )
    assert saved.status_code == 302
    row = AgentLimits.objects.get()
    assert (row.concurrency_limit, row.rate_count, row.updated_by) == (2, None, "user:ops")
    action = OperatorAction.objects.filter(source="dashboard").get()
    assert action.changes == {
        "concurrency_limit": {"before": 4, "after": 2},
        "rate_limit": {"before": {"count": 30, "period_seconds": 60}, "after": None},
    }


def test_the_admin_edits_limits_through_the_audit_log():
    admin = staff(
        "queue.add_agentlimits", "queue.change_agentlimits", "queue.delete_agentlimits",
        "queue.view_agentlimits", username="admin",
    )  # fmt: skip
    url = "/admin/queue/agentlimits/"
    refused = admin.post(f"{url}add/", {"agent_name": "EchoAgent", "rate_count": 5})
    assert refused.status_code == 200 and not AgentLimits.objects.exists()
    added = admin.post(f"{url}add/", {"agent_name": "EchoAgent", "concurrency_limit": 7})
    assert added.status_code == 302, added.content.decode()[:2000]
    assert AgentLimits.objects.get().concurrency_limit == 7
    admin.post(f"{url}EchoAgent/delete/", {"post": "yes"})
    assert not AgentLimits.objects.exists()
    assert list(OperatorAction.objects.values_list("source", "actor")) == [
        ("admin", "user:admin"),
        ("admin", "user:admin"),
    ]


def test_metrics_export_the_limits_and_their_use():
    limits.set_limits(
        "EchoAgent", concurrency_limit=4, rate_limit=limits.RateLimit(30, 60), actor="user:t"
    )
    operations.enqueue("EchoAgent", "echo", {})
    leasing.claim_tasks(owner="t:1", agents=["EchoAgent"], limit=10, lease_seconds=30, now=None)
    response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token('read')}")
    samples = {
        sample.name: sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
        if sample.name.startswith("automechanica_agent_")
        and sample.labels == {"agent": "EchoAgent"}
    }
    assert samples == {
        "automechanica_agent_concurrency_limit": 4,
        "automechanica_agent_concurrency_in_use": 1,
        "automechanica_agent_rate_limit": 30,
        "automechanica_agent_rate_limit_period_seconds": 60,
        "automechanica_agent_rate_in_use": 1,
    }
