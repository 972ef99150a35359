"""Agents' limits on the overview in a real browser (Chromium), against daphne and a
worker process: the use of a limit moves live, and an operator with the permission
edits it from the agent's row."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User

from task_queue import limits, operations
from task_queue.models import AgentLimits, OperatorAction
from tests.support.browser import needs_chromium
from tests.test_dashboard_browser import PASSWORD, db, live, log_in, shot

pytestmark = [pytest.mark.slow, needs_chromium]

LIMITS = 'tr[data-agent="EchoAgent"] [data-limits]'


def shows(page, text: str) -> None:
    """Until the agent's limits cell says ``text`` (pushed by the live updates)."""
    page.wait_for_function(
        "([selector, text]) => document.querySelector(selector).textContent.includes(text)",
        arg=[LIMITS, text],
        timeout=15_000,
    )


@pytest.fixture
def limited(transactional_db) -> None:
    """An operator who may set limits, a viewer who may not, and EchoAgent limited."""
    operator = User.objects.create_user("operator", password=PASSWORD, is_staff=True)
    operator.user_permissions.add(Permission.objects.get(codename="limit_agent"))
    User.objects.create_user("viewer", password=PASSWORD, is_staff=True)
    limits.set_limits(
        "EchoAgent",
        concurrency_limit=2,
        rate_limit=limits.RateLimit(100, 60),
        actor="user:test",
    )


def test_the_overview_shows_a_limit_in_use_and_the_operator_changes_it(
    limited, live_servers, worker_processes, browser
):
    server = live_servers()
    db(lambda: worker_processes("EchoAgent", "--concurrency", "10").wait_ready())
    page = log_in(browser, server, "operator")
    live(page)
    db(
        lambda: operations.enqueue_many(
            [operations.TaskSpec("EchoAgent", "echo", {"sleep_ms": 60_000})] * 6
        )
    )
    shows(page, "2 / 2 running")  # pushed live: the worker holds two of six
    shows(page, "2 / 100 per 60 s")
    shot(page, "overview-limits")

    page.click(f'{LIMITS} a[data-action="limits"]')
    page.wait_for_url("**/agents/EchoAgent/limits/")
    page.fill("#id_rate_period_seconds", "")  # a rate without its period: refused
    page.click('button[data-action="save"]')
    assert "both" in page.inner_text('[data-error="rate_period_seconds"]')
    page.fill("#id_rate_period_seconds", "60")
    page.fill("#id_concurrency_limit", "3")
    page.click('button[data-action="save"]')
    page.wait_for_url(f"{server.url}/")
    shows(page, "3 / 3 running")  # the raised limit woke the worker
    shot(page, "overview-limits-raised")
    assert db(lambda: AgentLimits.objects.get().concurrency_limit) == 3
    assert db(lambda: OperatorAction.objects.filter(source="dashboard").get().actor) == (
        "user:operator"
    )

    viewer = log_in(browser, server, "viewer")
    live(viewer)
    assert "3 / 3 running" in viewer.inner_text(LIMITS)
    assert viewer.query_selector(f'{LIMITS} a[data-action="limits"]') is None
