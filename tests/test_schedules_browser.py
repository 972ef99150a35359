"""The schedules page in a real browser (Debian's Chromium through Playwright),
against a real daphne and a real maintenance loop firing a one-second schedule:
runs arrive live, and Pause, Run now and Resume act and are audited; a schedule is
created through the page's form (a refused one first), edited and deleted."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User

from task_queue import schedules
from task_queue.models import OperatorAction, Schedule, Task
from tests.support.browser import needs_chromium
from tests.support.waiting import wait_for
from tests.test_dashboard_browser import PASSWORD, db, live, log_in, shot

pytestmark = [pytest.mark.slow, needs_chromium]

ROW = 'tr[data-schedule="every second"]'


@pytest.fixture
def operators(transactional_db) -> None:
    operator = User.objects.create_user("operator", password=PASSWORD, is_staff=True)
    operator.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="queue",
            codename__in=["operate_schedule", "add_schedule", "change_schedule",
                          "delete_schedule"],
        )
    )  # fmt: skip
    User.objects.create_user("viewer", password=PASSWORD, is_staff=True)


def runs_shown(page) -> int:
    return page.locator(f"{ROW} [data-run]").count()


def test_runs_arrive_live_and_the_schedule_is_paused_run_and_resumed(
    operators, live_servers, manage_processes, browser
):
    schedule = db(
        schedules.create,
        {"name": "every second", "interval_seconds": 1, "agent_name": "EchoAgent",
         "task_type": "echo", "payload": {"from": "schedule"}},
        actor="test", source="api",
    )  # fmt: skip
    server = live_servers()
    page = log_in(browser, server, "operator", "/schedules/")
    live(page)
    page.evaluate("window.notReloaded = true")
    manage_processes("runmaintenance", "--every", "0.2")
    page.wait_for_function(
        f"() => document.querySelectorAll('{ROW} [data-run]').length >= 3", timeout=30_000
    )
    assert page.evaluate("window.notReloaded") is True  # pushed, not reloaded
    assert page.locator('tr[data-schedule="analytics daily report"]').count() == 1  # settings
    shot(page, "schedules")

    page.click(f'{ROW} button:has-text("Pause")')
    page.wait_for_selector(f'{ROW} .tag:has-text("paused")')
    wait_for(lambda: db(lambda: not Schedule.objects.get(id=schedule.id).enabled), what="paused")
    shot(page, "schedules-paused")

    page.click(f'{ROW} button:has-text("Run now")')
    run_now = Task.objects.filter(idempotency_key__contains=":run:")
    task = wait_for(lambda: db(run_now.first), what="the task of Run now")
    page.wait_for_selector(f'{ROW} [data-last-run] a[href="/tasks/{task.id}/"]')

    page.click(f'{ROW} button:has-text("Resume")')
    page.wait_for_selector(f'{ROW} .tag:has-text("running")')
    audited = OperatorAction.objects.filter(source="dashboard").order_by("id")
    actions = db(lambda: list(audited.values_list("action", "actor")))
    assert actions == [("pause_schedule", "user:operator"), ("run_schedule", "user:operator"),
                       ("resume_schedule", "user:operator")]  # fmt: skip

    viewer = log_in(browser, server, "viewer", "/schedules/")
    live(viewer)
    assert viewer.locator(f"{ROW}").count() == 1
    assert viewer.locator("[data-action]").count() == 0
    shot(viewer, "schedules-viewer")


def test_a_schedule_is_created_edited_and_deleted_through_the_page(
    operators, live_servers, manage_processes, browser
):
    server = live_servers()
    page = log_in(browser, server, "operator", "/schedules/")
    live(page)
    page.click("details#new-schedule summary")
    form = 'form[data-form="new-schedule"]'
    page.fill(f"{form} [name=name]", "from the page")
    page.fill(f"{form} [name=cron]", "every minute")  # refused: not a cron expression
    page.select_option(f"{form} [name=agent_name]", "EchoAgent")
    page.fill(f"{form} [name=task_type]", "echo")
    page.fill(f"{form} [name=payload]", '{"from": "the form"}')
    page.click(f'{form} button[data-action="create"]')
    page.wait_for_selector(f'{form} [data-error="cron"]')
    assert "is not a cron expression" in page.inner_text(f'{form} [data-error="cron"]')
    assert page.input_value(f"{form} [name=payload]") == '{"from": "the form"}'  # kept
    assert db(lambda: not Schedule.objects.filter(name="from the page").exists())
    shot(page, "schedules-form-refused")

    page.fill(f"{form} [name=cron]", "")
    page.fill(f"{form} [name=interval_seconds]", "1")
    page.click(f'{form} button[data-action="create"]')
    new_row = 'tr[data-schedule="from the page"]'
    page.wait_for_selector(new_row)
    live(page)
    manage_processes("runmaintenance", "--every", "0.2")
    page.wait_for_selector(f"{new_row} [data-run]", timeout=30_000)  # it fires, live
    created = db(Schedule.objects.get, name="from the page")
    assert (created.source, created.payload) == ("dashboard", {"from": "the form"})
    shot(page, "schedules-created")

    page.click(f'{new_row} a[data-action="edit"]')
    page.wait_for_url(f"**/schedules/{created.id}/edit/")
    shot(page, "schedule-edit")
    page.fill("[name=interval_seconds]", "3600")
    page.click('button[data-action="save"]')
    page.wait_for_selector(f'{new_row} td:has-text("every 3600 s")')
    page.click(f'{new_row} a[data-action="edit"]')
    page.once("dialog", lambda dialog: dialog.accept())
    page.click('button[data-action="delete"]')
    page.wait_for_url("**/schedules/")
    page.wait_for_selector(".message:has-text('deleted')")
    assert page.locator(new_row).count() == 0
    audited = OperatorAction.objects.filter(source="dashboard").order_by("id")
    actions = db(lambda: list(audited.values_list("action", flat=True)))
    assert actions == ["create_schedule", "update_schedule", "delete_schedule"]
