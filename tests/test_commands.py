"""The management commands, as an operator runs them."""

import json
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from datetime import timedelta
from io import StringIO
from pathlib import Path

import psutil
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command, get_commands
from django.core.management.base import CommandError
from django.db.models import F

from task_queue.models import Task, TaskStatus, Worker
from tests.support.processes import REPO, manage_env, run_manage
from tests.support.server import free_port
from tests.support.waiting import wait_for
from workflows.models import Workflow

pytestmark = pytest.mark.django_db(transaction=True)

UUID_LINE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def call(*args):
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_our_runworker_wins_over_channels():
    assert get_commands()["runworker"] == "task_queue"


def test_only_runserver_loads_daphne():
    """daphne's app makes ``runserver`` ASGI (WebSockets work there) but installs
    Twisted's reactor as it loads: 0.6 s of every other command's start-up."""
    assert "daphne" not in settings.INSTALLED_APPS
    check = "import sys; print('twisted' in sys.modules)"
    loaded = run_manage("shell", "--no-imports", "-c", check)
    assert loaded.stdout.strip() == "False", loaded.stderr
    assert "--noasgi" in run_manage("runserver", "--help").stdout  # daphne's runserver


def test_enqueue_prints_one_id_per_line():
    out = call(
        "enqueue",
        "EchoAgent",
        "echo",
        "--payload",
        '{"n": 1}',
        "--priority",
        "0",
        "--max-attempts",
        "5",
        "--count",
        "3",
        "--delay",
        "30",
    )
    lines = out.strip().splitlines()
    assert len(lines) == 3 and all(UUID_LINE.match(line) for line in lines)
    tasks = Task.objects.filter(id__in=lines)
    assert {(t.payload["n"], t.priority, t.max_attempts, t.status) for t in tasks} == {
        (1, 0, 5, TaskStatus.PENDING)
    }
    task = tasks.first()
    assert 29 < (task.available_at - task.created_at).total_seconds() <= 30


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["Nobody", "echo"], "AGENT: unknown agent 'Nobody'; known: "),
        (["EchoAgent", "shout"], "TASK_TYPE: EchoAgent handles echo, not 'shout'"),
        (["EchoAgent", "echo", "--payload", "{nope"], "--payload is not valid JSON"),
        (["EchoAgent", "echo", "--payload", "[1]"], "--payload: must be a JSON object"),
        (["EchoAgent", "echo", "--priority", "10"], "--priority: must be an integer from 0 to 9"),
        (["EchoAgent", "echo", "--priority", "-1"], "--priority: must be an integer from 0 to 9"),
        (
            ["EchoAgent", "echo", "--max-attempts", "0"],
            "--max-attempts: must be an integer from 1 to 100",
        ),
        (["EchoAgent", "echo", "--count", "0"], "--count must be at least 1"),
        (["EchoAgent", "echo", "--delay", "-5"], "--delay: must be a number of seconds from 0 to"),
    ],
)
def test_enqueue_refuses_bad_input_and_writes_nothing(args, message):
    with pytest.raises(CommandError, match=re.escape(message)):
        call("enqueue", *args)
    assert Task.objects.count() == 0


def test_enqueue_error_is_one_line_and_non_zero_exit():
    result = run_manage("enqueue", "EchoAgent", "echo", "--priority", "99", timeout=60)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "CommandError: --priority: must be an integer from 0 to 9"
    ]


def test_queue_stats_json_has_every_status():
    call("enqueue", "EchoAgent", "echo", "--count", "2")
    call("enqueue", "RunRecorder", "record")
    # The EchoAgent tasks have waited an hour; the RunRecorder task, a moment.
    Task.objects.filter(agent_name="EchoAgent").update(
        available_at=F("available_at") - timedelta(hours=1)
    )
    stats = json.loads(call("queue_stats", "--json"))
    statuses = {"pending", "leased", "running", "completed", "failed", "dead", "cancelled"}
    assert set(stats["totals"]) == statuses
    assert stats["totals"]["pending"] == 3
    assert stats["by_agent"]["EchoAgent"] == {s: (2 if s == "pending" else 0) for s in statuses}
    assert stats["by_agent"]["RunRecorder"]["pending"] == 1
    assert 3600 <= stats["oldest_pending_age_seconds"] < 3660  # the oldest due task's wait


def test_queue_stats_table():
    call("enqueue", "EchoAgent", "echo")
    out = call("queue_stats")
    assert out.splitlines()[0].split() == [
        "agent",
        "pending",
        "leased",
        "running",
        "completed",
        "failed",
        "dead",
        "cancelled",
    ]
    assert out.splitlines()[1].split()[:2] == ["EchoAgent", "1"]


def test_runworker_refuses_unknown_agent():
    with pytest.raises(CommandError, match="unknown agent Nobody; known agents: "):
        call("runworker", "Nobody")


def test_runworker_max_tasks():
    call("enqueue", "EchoAgent", "echo", "--count", "5")
    call("runworker", "EchoAgent", "--max-tasks", "3", "--concurrency", "2")
    assert Task.objects.filter(status=TaskStatus.COMPLETED).count() == 3
    assert Task.objects.filter(status=TaskStatus.PENDING).count() == 2


@pytest.mark.slow
def test_up_serves_the_api_and_stops_everything_on_ctrl_c(transactional_db, tmp_path):
    port = free_port()
    log = (tmp_path / "up.log").open("wb")
    up = subprocess.Popen(
        [sys.executable, "manage.py", "up", "--demo", "--agents", "EchoAgent", "--port", str(port)],
        cwd=REPO,
        env=manage_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def answers(path: str) -> int:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5).status
        except urllib.error.HTTPError as error:
            return error.code
        except OSError:
            assert up.poll() is None, (tmp_path / "up.log").read_text()
            return 0

    try:
        wait_for(lambda: answers("/api/v1/tasks") == 401, timeout=90, what="the API")
        assert answers("/static/ninja/swagger-ui-bundle.js") == 200
        wait_for(lambda: Worker.objects.exists(), timeout=60, what="the worker")
        children = psutil.Process(up.pid).children(recursive=True)
        commands = sorted(" ".join(child.cmdline()[1:4]) for child in children)
        assert commands == [
            "-m daphne -b", "manage.py runembedder", "manage.py runmaintenance",
            "manage.py runorchestrator --api", "manage.py runworker EchoAgent",
        ]  # fmt: skip
        # --demo: the orchestrator starts workflows through the API, its token not
        # on its command line (where ps would show it).
        orchestrator = next(c for c in children if "runorchestrator" in c.cmdline())
        assert "--token" not in orchestrator.cmdline()
        wait_for(lambda: Workflow.objects.exists(), timeout=60, what="a demo workflow")
        # The first run made an admin user; not on a terminal, its password went to a
        # file only its owner can read, never to the log.
        admin = User.objects.get(is_superuser=True)
        printed = (tmp_path / "up.log").read_text()
        path = Path(printed.split("its password is in ")[1].split()[0])
        password = path.read_text().strip()
        assert admin.username == "admin" and admin.check_password(password)
        assert password not in printed and path.stat().st_mode & 0o777 == 0o600
        # No access log by default (up --access-log FILE asks for one).
        assert '"GET /api/v1/tasks' not in printed
        up.send_signal(signal.SIGINT)
        assert up.wait(60) == 0, (tmp_path / "up.log").read_text()
        _, alive = psutil.wait_procs(children, timeout=10)
        assert alive == []
        # Stopped in dependency order: the orchestrator (the API's client) before the
        # web server, the web server before the rest; so nothing prints a traceback.
        printed = (tmp_path / "up.log").read_text()
        stopped = re.findall(r"^(.+) stopped$", printed, re.MULTILINE)[:-1]  # then "all processes"
        assert stopped[:2] == ["demo orchestrator", "web server"], printed
        assert sorted(stopped[2:]) == ["EchoAgent", "agent memory", "maintenance"], printed
        assert "Traceback" not in printed, printed
    finally:
        if up.poll() is None:
            for child in psutil.Process(up.pid).children(recursive=True):
                child.kill()
            up.kill()
        log.close()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rounds", "0", "--remote"], "--rounds must be at least 1"),
        (["--rounds", "3"], "--rounds compares two ways of draining: it needs --remote"),
    ],
)
def test_queue_bench_refuses_rounds_it_cannot_run(args, message):
    with pytest.raises(CommandError, match=re.escape(message)):
        call("queue_bench", *args)
