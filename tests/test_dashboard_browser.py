"""The dashboard in a real browser (Debian's Chromium through Playwright), against a
real daphne and real worker processes. Every page visited is saved as a screenshot
in var/screenshots/."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from uuid import UUID

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection

from task_queue import operations
from task_queue.models import Task, TaskStatus
from tests.support.browser import SCREENSHOTS, needs_chromium
from tests.support.queue import fail_pending, make_failed, status_of
from tests.support.waiting import wait_for

PASSWORD = "a long test password"

pytestmark = [
    pytest.mark.slow,
    needs_chromium,
]


def db(function, *args: Any, **kwargs: Any) -> Any:
    """Run ORM code off Playwright's thread (Django refuses it inside an event loop)."""

    def run() -> Any:
        try:
            return function(*args, **kwargs)
        finally:
            connection.close()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def status(task_id: UUID) -> str:
    return db(status_of, task_id)


@pytest.fixture
def users(transactional_db) -> None:
    operator = User.objects.create_user("operator", password=PASSWORD, is_staff=True)
    operator.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="queue",
            codename__in=["revive_task", "cancel_task", "pause_agent"],
        )
    )
    User.objects.create_user("viewer", password=PASSWORD, is_staff=True)


def log_in(browser, server, username: str, path: str = "/"):
    page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
    page.goto(f"{server.url}/admin/login/?next={path}")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"**{path}")
    return page


WATCH_FOR_DOWN = """() => {
  window.wentDown = false;
  new MutationObserver(() => {
    if (document.querySelector(".live-badge.down")) window.wentDown = true;
  }).observe(document.body, {subtree: true, childList: true, attributes: true});
}"""


# window.reloads: how often the dead letter's results were fetched again (a GET aimed
# at them).
COUNT_RELOADS = """window.reloads = 0; document.addEventListener("htmx:afterRequest", (event) => {
    const { target, requestConfig } = event.detail;
    if (target.id === "dead-letter-results" && requestConfig.verb === "get") window.reloads++;
})"""


def live(page) -> None:
    page.wait_for_selector(".live-badge.live", timeout=10_000)


def shot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SCREENSHOTS / f"dashboard-{name}.png", full_page=True)


def count(page, agent: str, column: str) -> str:
    return page.inner_text(f'tr[data-agent="{agent}"] [data-count="{column}"]')


def test_overview_counts_move_while_a_worker_completes_tasks(
    users, live_servers, worker_processes, browser
):
    server = live_servers()
    worker = db(lambda: worker_processes("EchoAgent").wait_ready())
    page = log_in(browser, server, "operator")
    live(page)
    page.evaluate("window.notReloaded = true")
    assert count(page, "EchoAgent", "completed") == "0"

    ids = db(lambda: [operations.enqueue("EchoAgent", "echo", {"i": i}).id for i in range(5)])
    page.wait_for_function(
        """() => document.querySelector('tr[data-agent="EchoAgent"] [data-count="completed"]')
                 .textContent.trim() === "5" """,
        timeout=15_000,
    )
    assert page.evaluate("window.notReloaded") is True  # pushed, not reloaded
    assert all(status(i) == TaskStatus.COMPLETED for i in ids)
    assert f">{worker.pid}<" in page.inner_html("#overview-live")  # the workers table
    shot(page, "overview")

    # Pause from the overview: the queue holds while paused, and drains once resumed.
    page.click('tr[data-agent="EchoAgent"] button:has-text("Pause")')
    page.wait_for_selector('tr[data-agent="EchoAgent"] .tag:has-text("paused")')
    held = db(lambda: operations.enqueue("EchoAgent", "echo", {}).id)
    page.wait_for_function(
        """() => document.querySelector('tr[data-agent="EchoAgent"] [data-count="pending"]')
                 .textContent.trim() === "1" """,
        timeout=10_000,
    )
    shot(page, "overview-paused")
    assert status(held) == TaskStatus.PENDING
    page.click('tr[data-agent="EchoAgent"] button:has-text("Resume")')
    wait_for(lambda: status(held) == TaskStatus.COMPLETED, what="the resumed queue")

    # The socket comes back by itself after a server restart (it may be back before
    # restart() returns: the badge's going down is recorded as it happens).
    page.evaluate(WATCH_FOR_DOWN)
    server.restart()
    page.wait_for_function("window.wentDown", timeout=10_000)
    live(page)
    db(lambda: operations.enqueue("EchoAgent", "echo", {}))
    page.wait_for_function(
        """() => document.querySelector('tr[data-agent="EchoAgent"] [data-count="completed"]')
                 .textContent.trim() === "7" """,
        timeout=20_000,
    )
    assert page.evaluate("window.notReloaded") is True


def test_revive_and_edit_from_the_dead_letter(users, live_servers, worker_processes, browser):
    server = live_servers()
    plain, other, to_edit = db(make_failed, [{"n": 1}, {"n": 2}, {"fail": "permanent"}])
    db(lambda: worker_processes("EchoAgent").wait_ready())
    page = log_in(browser, server, "operator", "/dead-letter/")
    elsewhere = log_in(browser, server, "viewer", "/dead-letter/")
    errors = console_errors(page)
    live(page)
    live(elsewhere)
    shot(page, "dead-letter")

    # Revive one: it leaves both browsers' lists without a reload, and completes. The
    # outcome is shown, even when the socket says the row left before the answer came.
    page.click(f'#dl-{plain} button[data-action="revive"]')
    page.wait_for_selector("text=Revived 1 task(s).")
    page.wait_for_selector(f"#dl-{plain}", state="detached")
    elsewhere.wait_for_selector(f"#dl-{plain}", state="detached", timeout=5_000)
    wait_for(lambda: status(plain) == TaskStatus.COMPLETED, what="the revived task")

    # Revived from the other browser (through the API's operation): leaves this one live.
    db(operations.revive, [other], actor="token:elsewhere", source="api")
    page.wait_for_selector(f"#dl-{other}", state="detached", timeout=5_000)
    assert errors == []

    # Edit the payload, with a mistake first, then revive; watch the task complete.
    page.goto(f"{server.url}/tasks/{to_edit}/")
    shot(page, "task-failed")
    page.click('[data-action="edit"]')
    page.fill("#payload", '{"fixed": true,')
    page.click('[data-action="save"]')
    page.wait_for_selector("[data-error]")
    shot(page, "task-edit-error")
    assert status(to_edit) == TaskStatus.FAILED
    page.fill("#payload", json.dumps({"fixed": True}))
    page.click('[data-action="save"]')
    page.wait_for_url(f"**/tasks/{to_edit}/")
    live(page)
    page.wait_for_selector('#task-live[data-status="completed"]', timeout=15_000)
    assert '"fixed": true' in page.inner_text("#task-live")
    assert "Edit payload and revive" in page.inner_text("#task-live")  # operator actions
    shot(page, "task-completed")

    for path, name in [("/audit/", "audit"), ("/workers/", "workers"),
                       ("/workflows/", "workflows")]:  # fmt: skip
        page.goto(server.url + path)
        page.wait_for_load_state()
        shot(page, name)
    page.goto(server.url + "/audit/")
    audit = page.inner_text("main")
    assert "user:operator" in audit and '+  "fixed": true' in audit


def console_errors(page) -> list[str]:
    errors: list[str] = []
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))
    return errors


def test_the_dead_letter_follows_arrivals_and_bulk_changes(users, live_servers, browser):
    server = live_servers()
    db(make_failed, [{"n": n} for n in range(3)])
    page = log_in(browser, server, "operator", "/dead-letter/")
    errors = console_errors(page)
    live(page)

    # One task dies: announced (not inserted under the operator's selection), counted.
    db(make_failed, [{"n": 3}])
    page.wait_for_selector("#dead-letter-arrivals:not([hidden])", timeout=5_000)
    assert page.inner_text("#dead-letter-arrivals [data-n]") == "1"
    page.wait_for_function("document.getElementById('dead-letter-count').textContent === '4'")
    shot(page, "dead-letter-arrivals")
    page.click("#dead-letter-arrivals button")
    page.wait_for_function("document.querySelectorAll('tr[data-task]').length === 4")

    # 70 die in one statement: announced and counted too.
    db(make_failed, [{"n": n} for n in range(4, 74)])
    page.wait_for_function("document.getElementById('dead-letter-count').textContent === '74'")
    assert page.inner_text("#dead-letter-arrivals [data-n]") == "70"

    # Revived elsewhere, 74 in one statement: one notification names 60 of them, so
    # the results reload (a GET aimed at them), and the page's own banner goes away.
    page.evaluate(COUNT_RELOADS)
    ids = db(lambda: list(Task.objects.filter(status="failed").values_list("id", flat=True)))
    db(operations.revive, ids, actor="user:elsewhere")
    page.wait_for_function("window.reloads === 1")
    page.wait_for_function("document.querySelectorAll('tr[data-task]').length === 0")
    assert page.locator("#dead-letter-arrivals").is_hidden()

    # Revive all matching, here: the confirmation states the count it acts on, and
    # the outcome stays on the page through the reload its own notification causes.
    db(fail_pending, "EchoAgent", retryable=False)  # the 74 fail again
    page.click("#dead-letter-arrivals button")
    page.wait_for_function("document.getElementById('dead-letter-count').textContent === '74'")
    page.click('[data-bulk="revive-all"]')
    assert page.inner_text("[data-confirm-count]") == "74"
    shot(page, "dead-letter-confirm")
    page.evaluate("window.reloads = 0")
    page.click("[data-confirm]")
    page.wait_for_selector("text=Revived 74 task(s).")
    page.wait_for_function("window.reloads === 1")
    assert page.inner_text("#dead-letter-count") == "0"
    assert page.locator("text=Revived 74 task(s).").count() == 1
    assert errors == []


def test_the_dead_letter_catches_up_after_its_socket_was_down(users, live_servers, browser):
    # What changes while no server runs sends the page no notification: once its
    # socket is back, it fetches its results again.
    server = live_servers()
    shown = db(make_failed, [{"n": n} for n in range(3)])
    page = log_in(browser, server, "operator", "/dead-letter/")
    errors = console_errors(page)
    live(page)
    page.evaluate(WATCH_FOR_DOWN)

    with server.stopped():
        page.wait_for_function("window.wentDown", timeout=10_000)
        (arrived,) = db(make_failed, [{"n": 3}])
        db(operations.revive, shown[:2], actor="user:elsewhere")
    live(page)

    page.wait_for_selector(f"#dl-{arrived}", timeout=10_000)
    page.wait_for_function(f"!document.getElementById('dl-{shown[0]}')")
    page.wait_for_function("document.getElementById('dead-letter-count').textContent === '2'")
    shot(page, "dead-letter-caught-up")

    # The server's own LISTEN lost (the page's socket stays open): what changed until it
    # listens again was notified to no one, so once it does, the page looks again.
    page.evaluate(COUNT_RELOADS)
    db(terminate_listeners)
    page.wait_for_function("window.reloads === 1", timeout=10_000)
    assert errors == []


def terminate_listeners() -> None:
    """End the sessions that LISTEN (here, the dashboard hub's): as a database restart
    or a network cut would."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND query ILIKE '%LISTEN %'"
        )


def test_the_dead_letter_filter_keeps_the_page_address(users, live_servers, browser):
    server = live_servers()
    teal, grey = db(make_failed, [{"colour": "teal"}, {"colour": "grey"}])
    page = log_in(browser, server, "viewer", "/dead-letter/")
    errors = console_errors(page)
    live(page)

    # The filter swaps in the results alone and pushes the page's own address.
    page.fill("#id_q", "teal")
    page.click(".filters button[type=submit]")
    page.wait_for_selector(f"#dl-{grey}", state="detached")
    assert page.locator(f"#dl-{teal}").count() == 1 and page.locator("h1").count() == 1
    assert "/dead-letter/?" in page.url and "q=teal" in page.url
    shot(page, "dead-letter-filtered")

    # Revived elsewhere: the row leaves, and the count is fetched again for the filter.
    db(operations.revive, [teal], actor="user:elsewhere")
    page.wait_for_selector(f"#dl-{teal}", state="detached", timeout=5_000)
    page.wait_for_function("document.getElementById('dead-letter-count').textContent === '0'")
    page.reload()
    assert page.inner_text("#dead-letter-count") == "0" and page.locator("h1").count() == 1
    assert errors == []


def test_an_open_page_stops_updating_once_its_user_logs_out(users, live_servers, browser):
    server = live_servers()
    page = log_in(browser, server, "viewer", "/")
    live(page)
    elsewhere = page.context.new_page()  # the same session, in another tab
    elsewhere.goto(server.url + "/admin/")
    elsewhere.click("#logout-form button")
    page.wait_for_selector(".live-badge:has-text('signed out')", timeout=15_000)
    shot(page, "overview-signed-out")


def test_without_the_permission_no_button_and_a_forged_post_is_refused(
    users, live_servers, browser
):
    server = live_servers()
    (task_id,) = db(make_failed, [{"n": 1}])
    page = log_in(browser, server, "viewer", "/dead-letter/")
    assert page.locator(f"#dl-{task_id}").count() == 1
    assert page.locator('[data-action="revive"], [data-bulk]').count() == 0
    shot(page, "dead-letter-viewer")
    page.goto(f"{server.url}/tasks/{task_id}/")
    assert page.locator('[data-action="revive"], [data-action="edit"]').count() == 0

    # The same request the operator's button sends, forged with a valid CSRF token.
    token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    for path in [f"/tasks/{task_id}/revive/", "/dead-letter/act/"]:
        response = page.request.post(
            server.url + path,
            form={"action": "revive", "ids": str(task_id)},
            headers={"X-CSRFToken": token, "Referer": server.url + "/dead-letter/"},
        )
        assert response.status == 403, path
    assert status(task_id) == TaskStatus.FAILED


def test_a_websocket_without_a_session_is_refused(users, live_servers, browser):
    server = live_servers()
    page = browser.new_page()
    page.goto(server.url + "/admin/login/")  # same origin, not logged in
    outcome = page.evaluate(
        """(url) => new Promise((resolve) => {
            const socket = new WebSocket(url);
            socket.onopen = () => resolve("open");
            socket.onclose = (event) => resolve("closed " + event.code);
        })""",
        server.url.replace("http", "ws") + "/ws/overview/",
    )
    assert outcome == "closed 1006"  # the handshake was refused (403)
    page.goto(server.url + "/")
    assert "/admin/login/" in page.url  # and the page itself asks for a login


def test_a_daily_report_page(users, live_servers, browser):
    from agents_app.analytics import build_daily_report
    from agents_app.models import DailyReport
    from tests.support.history import T0, at, seed_day_and_week

    def written() -> None:
        seed_day_and_week()
        report = build_daily_report(T0.date(), now=at(26 * 3600))
        DailyReport.objects.create(day=T0.date(), report=report, partial=False)

    db(written)
    server = live_servers()
    page = log_in(browser, server, "viewer", "/reports/daily/")
    page.click('a[href="/reports/daily/2026-11-20/"]')
    page.wait_for_selector('[data-anomaly="failure_rate"]')
    assert page.locator("svg.chart").count() == 2
    assert page.inner_text('[data-total="completed"]') == "3"
    shot(page, "daily-report")
    page.click("[data-example-task] >> nth=0")
    page.wait_for_selector("#similar-tasks")
    shot(page, "report-example-task")


def test_the_messages_page(users, live_servers, browser):
    from agents_app.messaging import send
    from agents_app.pubsub import publish, subscribe

    def traffic() -> None:
        for n in range(4):
            send("PricingAgent", "FitmentAgent", "task_request", {"n": n}, priority=n + 1)
        subscribe("Monitor", "states", "state.*")
        publish("FitmentAgent", "state.changed", {"to": "paused"})

    db(traffic)
    server = live_servers()
    page = log_in(browser, server, "viewer", "/messages/")
    assert page.inner_text('[data-mailbox="FitmentAgent"] [data-waiting]') == "4"
    assert page.inner_text('[data-subscription="Monitor/states"] [data-backlog]') == "1"
    shot(page, "messages")


def test_a_failed_message_is_revived_from_the_messages_page(users, live_servers, browser):
    from agents_app.messaging import send
    from agents_app.models import AgentMessage

    def poison() -> str:
        message_id = send("PricingAgent", "FitmentAgent", "command", {"do": "crash"})
        AgentMessage.objects.filter(id=message_id).update(status="failed", delivery_count=5)
        User.objects.get(username="operator").user_permissions.add(
            Permission.objects.get(codename="revive_agentmessage")
        )
        return str(message_id)

    message_id = db(poison)
    server = live_servers()
    row = f'[data-failed-message="{message_id}"]'
    viewer = log_in(browser, server, "viewer", "/messages/")
    assert viewer.locator(row).count() == 1 and viewer.locator(f"{row} button").count() == 0
    page = log_in(browser, server, "operator", "/messages/")
    page.click(f"{row} button:text('Revive')")
    page.wait_for_selector("text=revived: it will be delivered again")
    assert page.locator(row).count() == 0
    assert db(lambda: AgentMessage.objects.get(id=message_id).status) == "pending"
