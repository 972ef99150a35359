"""The interactive API docs in a real browser (Debian's Chromium through Playwright)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from automechanica.api.main import api
from tests.support.browser import SCREENSHOTS, needs_chromium

pytestmark = [
    pytest.mark.slow,
    needs_chromium,
]


@pytest.fixture
def server(live_servers):
    """The server and a staff user, made before Playwright's event loop starts (the
    ORM refuses to run inside one)."""
    User.objects.create_user("ops", password="a long test password", is_staff=True)
    return live_servers()


def test_staff_user_logs_in_and_reads_the_api_docs(server, browser):
    page = browser.new_page(viewport={"width": 1280, "height": 1600})

    page.goto(server.url + "/api/docs")
    assert "log in as a staff user" in page.content()  # no session: refused

    page.goto(server.url + "/admin/login/?next=/api/docs")
    page.fill("#id_username", "ops")
    page.fill("#id_password", "a long test password")
    page.click("input[type=submit]")
    page.wait_for_url("**/api/docs")
    # Swagger UI renders from our own static files and the token-guarded schema.
    page.wait_for_selector("text=AutoMechanica API")
    page.wait_for_selector("#operations-tasks-create_tasks")
    operations = page.locator(".opblock").count()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SCREENSHOTS / "api-docs.png", full_page=False)
    # Every operation of the schema is shown, however many routes there are.
    schema_paths = api.get_openapi_schema()["paths"].values()
    assert operations == sum(len(methods) for methods in schema_paths)

    page.click("#operations-tasks-create_tasks .opblock-summary")
    page.wait_for_selector("text=FitmentAgent")  # the request example
    page.screenshot(path=SCREENSHOTS / "api-docs-create-task.png", full_page=False)
