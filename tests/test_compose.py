"""docker-compose.yml runs what ``manage.py up`` runs (no Docker engine here: the file
is read, not run).

The processes come from the code ``up`` uses (``long_running_commands`` with the
registered agents), in a process of their own with only the product's agents, so a
new agent or a new process that ``up`` starts fails here until compose has a service
for it. Every ``manage.py`` command a service runs must exist.
"""

import json
import os
import re
import shlex
import subprocess
import sys

import pytest
import yaml
from django.conf import settings
from django.core.management import get_commands

from tests.support.processes import REPO

COMPOSE = REPO / "docker-compose.yml"
ASGI_APP = "automechanica.asgi:application"

UP_PROCESSES = """
import json
import os
from automechanica.management.commands.up import long_running_commands
from task_queue import registry
print(json.dumps(long_running_commands(registry.names(), 10, "0.0.0.0", 8000, None)))
"""


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def up_processes() -> dict[str, list[str]]:
    """What ``up`` starts on a fresh deployment: no test agents, no extra modules."""
    env = {k: v for k, v in os.environ.items() if k != "AUTOMECHANICA_AGENT_MODULES"}
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", UP_PROCESSES],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def argv(service: dict) -> list[str]:
    command = service.get("command") or []
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


def identity(args: list[str]) -> tuple[str, ...] | None:
    """What makes a process the one it is: ``manage.py``'s command and its positional
    arguments (``runworker AGENT``), or daphne's application."""
    if args[:2] == ["python", "manage.py"]:
        args = args[1:]
    if args[:2] == ["-m", "daphne"]:
        args = args[1:]
    if args and args[0] == "manage.py":
        positional = []
        for arg in args[1:]:
            if arg.startswith("-"):
                break
            positional.append(arg)
        return ("manage.py", *positional)
    if args and args[0] == "daphne":
        return ("daphne", args[-1])
    return None


def default_services(compose: dict) -> dict[str, dict]:
    """The services ``docker compose up`` starts: those behind no profile."""
    return {name: s for name, s in compose["services"].items() if not s.get("profiles")}


def test_every_process_up_starts_has_a_service(compose, up_processes):
    assert "AnalyticsAgent" in up_processes  # the one that was missing once
    services = {identity(argv(s)) for s in default_services(compose).values()}
    missing = {name: args for name, args in up_processes.items() if identity(args) not in services}
    assert not missing, f"docker-compose.yml has no service for {missing}"


def test_every_service_runs_a_command_that_exists(compose, up_processes):
    commands = get_commands()
    agents = {identity(args)[2] for args in up_processes.values() if "runworker" in args}
    for name, service in compose["services"].items():
        args = argv(service)
        if not args or args[:2] != ["python", "manage.py"]:
            continue
        command = args[2]
        assert command in commands, f"service {name}: no manage.py command {command!r}"
        if command == "runworker":
            assert commands[command] == "task_queue", "channels' runworker would run"
            assert args[3] in agents, f"service {name}: no agent {args[3]!r}"


def test_the_relay_is_optional_behind_a_profile(compose):
    relays = [s for s in compose["services"].values() if argv(s)[2:3] == ["relay_events"]]
    assert relays and all(s.get("profiles") == ["relay"] for s in relays)


def test_app_services_need_a_secret_key_and_share_the_blobs(compose):
    for name, service in compose["services"].items():
        if identity(argv(service)) is None:
            continue
        env = service["environment"]
        assert env["DJANGO_SECRET_KEY"].startswith("${DJANGO_SECRET_KEY:?"), name
        assert "DATABASE_URL" in env and "DJANGO_ALLOWED_HOSTS" in env, name
        if argv(service)[2:3] != ["migrate"]:  # the one that writes no payloads
            assert any(v.startswith("blobs:") for v in service.get("volumes", [])), name


def test_daphne_is_reached_only_through_a_proxy_with_the_body_limit(compose):
    services = compose["services"]
    web = next(s for s in services.values() if identity(argv(s)) == ("daphne", ASGI_APP))
    assert "ports" not in web
    proxy = services["proxy"]
    assert proxy["image"].startswith("nginx:")
    mounted = {v.split(":")[0]: v.split(":")[1] for v in proxy["volumes"]}
    assert mounted["./deploy/nginx.conf"].startswith("/etc/nginx/conf.d/")
    config = (REPO / "deploy" / "nginx.conf").read_text()
    size = re.search(r"^\s*client_max_body_size\s+(\d+)([km]?);", config, re.M | re.I)
    limit = int(size[1]) * {"": 1, "k": 1024, "m": 1024 * 1024}[size[2].lower()]
    assert limit == settings.API_MAX_REQUEST_BYTES
    assert re.search(r"proxy_set_header\s+X-Forwarded-Proto\s+\$scheme;", config)
    assert re.search(r"proxy_set_header\s+Upgrade\s+\$http_upgrade;", config)
    # The port stays in the Host (a login's Origin is checked against it).
    assert re.search(r"proxy_set_header\s+Host\s+\$http_host;", config)


def test_the_image_installs_exactly_the_lock():
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(r"^RUN uv sync --locked\b", dockerfile, re.M)
