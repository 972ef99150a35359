"""The long-running commands that serve no URL (workers, loops) run every system
check but the URL conf's as they start: the project's own checks still stop them, and
they do not import the HTTP API (half a second of every start)."""

from __future__ import annotations

import pytest
from django.core.management import load_command_class

from tests.support.processes import manage_env, run_manage

pytestmark = pytest.mark.django_db

COMMANDS = {
    "runworker": "task_queue",
    "runmaintenance": "task_queue",
    "relay_events": "task_queue",
    "export_events": "task_queue",
    "runembedder": "agents_app",
    "runorchestrator": "workflows",
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_check_runs_but_the_url_confs(name):
    tags = load_command_class(COMMANDS[name], name).requires_system_checks
    assert "urls" not in tags
    assert {"settings", "models", "database", "security"} <= set(tags)


def test_a_bad_setting_still_stops_a_worker_which_never_imports_the_api():
    env = manage_env() | {"MESSAGE_MAX_DELIVERIES": "0"}
    refused = run_manage("runworker", "EchoAgent", "--burst", env=env)
    assert refused.returncode != 0 and "queue.E002" in refused.stderr
    ran = run_manage("runworker", "EchoAgent", "--burst", env=manage_env() | {
        "PYTHONPROFILEIMPORTTIME": "1",
    })  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    imported = ran.stderr
    assert "automechanica.api.routers" not in imported and "automechanica.urls" not in imported
    assert "task_queue.worker" in imported  # the import times are there to read
