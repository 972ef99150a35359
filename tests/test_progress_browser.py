"""A task page's progress bar and the workers page's states, in a real browser
(Debian's Chromium) against a real daphne and a real worker process: the bar moves
as the handler reports, without the page being reloaded."""

from __future__ import annotations

import pytest

from task_queue import operations
from tests.support.browser import needs_chromium
from tests.test_dashboard_browser import db, live, log_in, shot, users  # noqa: F401 - fixture

pytestmark = [pytest.mark.slow, needs_chromium]


def test_the_progress_bar_moves_while_the_task_runs(
    users,  # noqa: F811 - the fixture
    live_servers,
    worker_processes,
    browser,
    tmp_path,
):
    server = live_servers()
    db(lambda: worker_processes("Progress", "--lease", "1.5", "--poll", "0.2").wait_ready())
    cue = str(tmp_path / "cue")
    steps = [[0.3, "first third"], [0.6, "second third"]]
    task = db(lambda: operations.enqueue("Progress", "progress", {"steps": steps, "cue": cue}))

    page = log_in(browser, server, "operator", f"/tasks/{task.id}/")
    live(page)
    page.evaluate("window.notReloaded = true")
    page.wait_for_selector('[data-task-progress="0.3"]', timeout=15_000)
    assert "30%" in page.inner_text(".task-progress")
    assert page.inner_text("[data-progress-message]") == "first third"
    shot(page, "task-progress")

    (tmp_path / "cue.0").touch()
    page.wait_for_selector('[data-task-progress="0.6"]', timeout=15_000)
    assert page.inner_text("[data-progress-message]") == "second third"
    assert page.get_attribute('[role="progressbar"]', "aria-valuenow") == "60"

    # The workers page shows the worker busy with this task.
    workers = page.context.new_page()
    workers.goto(f"{server.url}/workers/")
    workers.wait_for_selector('[data-worker-state="busy"]', timeout=15_000)
    assert workers.get_attribute("[data-worker-task]", "data-worker-task") == str(task.id)
    shot(workers, "workers-busy")

    (tmp_path / "cue.1").touch()
    page.wait_for_selector('[data-task-status]:has-text("completed")', timeout=15_000)
    assert page.query_selector(".task-progress") is None  # the bar is for running tasks
    assert page.evaluate("window.notReloaded") is True  # pushed, not reloaded
