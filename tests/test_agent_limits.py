"""Per-agent limits across the cluster (task_queue.limits), enforced by the lease query."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models import Min

from task_queue import limits, operations
from task_queue.limits import InvalidLimit, RateLimit
from task_queue.models import AgentLimits, OperatorAction, Task
from task_queue.sql import leasing

pytestmark = pytest.mark.django_db(transaction=True)


def claim(owner: str, limit: int = 50) -> list[leasing.ClaimedTask]:
    return leasing.claim_tasks(
        owner=owner, agents=["EchoAgent"], limit=limit, lease_seconds=30, now=None
    )


def test_a_claim_takes_no_more_than_the_concurrency_limit_leaves_room_for():
    operations.enqueue_many([operations.TaskSpec("EchoAgent", "echo")] * 10)
    limits.set_limits("EchoAgent", concurrency_limit=3, actor="user:test")
    assert len(claim("t:1")) == 3
    assert claim("t:2") == []
    # At the limit a worker sleeps until a held task ends (no due time to poll for).
    assert leasing.next_due_at(["EchoAgent"]) is None
    limits.set_limits("EchoAgent", concurrency_limit=5, actor="user:test")
    assert len(claim("t:2")) == 2
    limits.set_limits("EchoAgent", concurrency_limit=None, actor="user:test")
    assert len(claim("t:3")) == 5
    assert not AgentLimits.objects.exists()


def test_a_claim_takes_no_more_than_the_rate_window_has_room_for():
    operations.enqueue_many([operations.TaskSpec("EchoAgent", "echo")] * 10)
    limits.set_limits("EchoAgent", rate_limit=RateLimit(4, 3600), actor="user:test")
    assert len(claim("t:1", limit=3)) == 3
    assert len(claim("t:2")) == 1
    assert claim("t:3") == []
    # The window frees an hour after the first start: the worker's timer waits for it.
    first_start = Task.objects.aggregate(first=Min("started_at"))["first"]
    assert leasing.next_due_at(["EchoAgent"]) == first_start + timedelta(hours=1)
    usage = limits.limits_in_use()["EchoAgent"]
    assert (usage.held, usage.recent_starts, usage.rate_count) == (4, 4, 4)
    # A changed rate counts the starts already in the window.
    limits.set_limits("EchoAgent", rate_limit=RateLimit(5, 3600), actor="user:test")
    assert len(claim("t:4")) == 1


def test_changes_are_validated_and_audited():
    with pytest.raises(InvalidLimit) as refused:
        limits.set_limits("EchoAgent", concurrency_limit=0, actor="user:test")
    assert refused.value.field == "concurrency_limit"
    with pytest.raises(InvalidLimit) as refused:
        limits.set_limits("EchoAgent", rate_limit=RateLimit(5, 10**9), actor="user:test")
    assert refused.value.field == "rate_limit.period_seconds"
    with pytest.raises(KeyError):
        limits.set_limits("NoSuchAgent", concurrency_limit=1, actor="user:test")
    assert not AgentLimits.objects.exists() and not OperatorAction.objects.exists()

    limits.set_limits("EchoAgent", concurrency_limit=2, actor="user:ops", source="api")
    limits.set_limits("EchoAgent", concurrency_limit=2, actor="user:ops")  # no change
    limits.set_limits("EchoAgent", rate_limit=RateLimit(5, 60), actor="user:ops")
    actions = list(OperatorAction.objects.order_by("id").values("action", "actor", "changes"))
    assert actions == [
        {
            "action": "limit",
            "actor": "user:ops",
            "changes": {"concurrency_limit": {"before": None, "after": 2}},
        },
        {
            "action": "limit",
            "actor": "user:ops",
            "changes": {
                "rate_limit": {"before": None, "after": {"count": 5, "period_seconds": 60}}
            },
        },
    ]
