"""``manage.py up [--demo] [--port 8000] [--access-log FILE]``: run the product on one machine.

Applies migrations (starting the embedded database when ``DATABASE_URL`` is unset),
creates an admin user on the first run (printing its generated password once on a
terminal, or else writing it to ``var/admin-password``, readable by its owner only), then
runs the web server (daphne: dashboard, admin, API, WebSockets), one ``runworker``
process per agent, the maintenance loop and the embedding worker, and supervises
them: a process that dies is reported and the others are stopped. ``--demo`` adds
the reference orchestrator with a stream of supplier feeds, some of whose parts
fail. Ctrl-C (or SIGTERM) stops every process gracefully, the orchestrator first,
then the web server, then the rest; a second Ctrl-C stops them at once.
"""

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from automechanica.api.models import ApiToken
from automechanica.api.tokens import create_token
from automechanica.private_files import replace_private_file
from task_queue import registry
from workflows.orchestrator.client import TOKEN_VARIABLE

DEMO_TOKEN_NAME = "demo orchestrator"
# Stopped first, one stage at a time: the orchestrator is the web server's client.
# The workers, maintenance and the embedder need only the database and stop last.
STOP_ORDER = ("demo orchestrator", "web server")
ADMIN_PASSWORD_FILE = "admin-password"


class Command(BaseCommand):
    help = (
        "Migrate, then run the web server, a worker per agent and the maintenance loop "
        "(with --demo, a demo orchestrator too) until Ctrl-C."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--agents", nargs="+", metavar="AGENT", help="only these agents (default: all)"
        )
        parser.add_argument("--concurrency", type=int, default=10, help="per worker (10)")
        parser.add_argument("--host", default="127.0.0.1", help="web server address")
        parser.add_argument("--port", type=int, default=8000, help="web server port (8000)")
        parser.add_argument(
            "--access-log",
            metavar="FILE",
            help="write the web server's access log (a line per request) to FILE, "
            "or to the terminal with '-' (default: none)",
        )
        parser.add_argument(
            "--demo",
            action="store_true",
            help="also run the orchestrator with a stream of demo workflows, some failing",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        agents = options["agents"] or registry.names()
        unknown = sorted(set(agents) - set(registry.names()))
        if unknown:
            raise CommandError(f"unknown agent {', '.join(unknown)}")
        call_command("migrate", interactive=False, verbosity=0)
        self._first_admin()
        self.stdout.write("database ready; starting workers: " + ", ".join(agents))
        commands = long_running_commands(
            agents, options["concurrency"], options["host"], options["port"], options["access_log"]
        )
        url = f"http://{options['host']}:{options['port']}"
        environments = {}
        if options["demo"]:
            api_url = _local_url(options["host"], options["port"])
            commands["demo orchestrator"] = [
                "manage.py", "runorchestrator", "--api", api_url, "--demo-every", "4",
            ]  # fmt: skip
            # In its environment, not its argv (which ps shows), and only in its own.
            environments["demo orchestrator"] = os.environ | {TOKEN_VARIABLE: _demo_token()}
        self.stdout.write(f"dashboard: {url}/   admin: {url}/admin/   API docs: {url}/api/docs")
        workers = {
            name: subprocess.Popen(
                [sys.executable, *command],
                cwd=settings.BASE_DIR,
                env=environments.get(name),  # None: this process's environment
                # Their own session: a terminal's Ctrl-C reaches only this process,
                # which passes on one SIGTERM per Ctrl-C (two would skip the grace).
                start_new_session=True,
            )
            for name, command in commands.items()
        }
        stop_requests = 0

        def on_signal(signum: int, frame: object) -> None:
            # Only counts: the supervising loop below acts on it.
            nonlocal stop_requests
            stop_requests += 1

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        failed = self._supervise(workers, lambda: stop_requests)
        if failed is not None:
            raise CommandError(f"the {failed} process exited with {workers[failed].returncode}")
        self.stdout.write("all processes stopped")

    def _supervise(
        self, processes: dict[str, subprocess.Popen], stop_requests: Callable[[], int]
    ) -> str | None:
        """Run until every process has exited; returns the one whose exit stopped the
        others, if one did.

        A stop (the first Ctrl-C or SIGTERM, or a process exiting) goes through
        :data:`STOP_ORDER`: each stage gets one SIGTERM (its grace period) and is
        waited for before the next, so the orchestrator never talks to a stopped web
        server. A second Ctrl-C gives every process its second SIGTERM: exit at once.
        """
        signalled = dict.fromkeys(processes, 0)
        stages = _stop_stages(processes)
        exited: set[str] = set()
        failed, stopping = None, False
        while True:
            for name, process in processes.items():
                if name in exited or process.poll() is None:
                    continue
                exited.add(name)
                if stopping:
                    self.stdout.write(f"{name} stopped")
                else:
                    failed, stopping = name, True
                    self.stderr.write(f"the {name} process exited; stopping the others")
            if len(exited) == len(processes):
                return failed
            stopping = stopping or stop_requests() > 0
            if stop_requests() >= 2:
                wanted = {name: 2 for name in processes}
            elif stopping:
                stage = next(s for s in stages if not exited.issuperset(s))
                wanted = dict.fromkeys(stage, 1)
            else:
                wanted = {}
            for name, times in wanted.items():
                while signalled[name] < times and processes[name].poll() is None:
                    processes[name].send_signal(signal.SIGTERM)
                    signalled[name] += 1
            time.sleep(0.2)  # supervising child processes: nothing to wait on but them

    def _first_admin(self) -> None:
        """On the first run, a superuser ``admin`` whose password is printed this once."""
        users = get_user_model()
        if users.objects.filter(is_superuser=True).exists():
            return
        password = secrets.token_urlsafe(12)
        if self.stdout.isatty():
            shown = f" / {password}\n  (shown this once; "
        else:
            # Not a terminal (a container's log, a file): the password goes to a file
            # only its owner can read, written before the user exists so that it cannot
            # be lost, and the output names the file.
            path = replace_private_file(settings.VAR_DIR / ADMIN_PASSWORD_FILE, password + "\n")
            shown = f"; its password is in {path} (readable by you only; "
        users.objects.create_superuser("admin", "", password)
        self.stdout.write(
            self.style.SUCCESS(
                f"created the admin user: admin{shown}change it in the admin or with "
                "`manage.py changepassword`)"
            )
        )


def long_running_commands(
    agents: Iterable[str], concurrency: int, host: str, port: int, access_log: str | None
) -> dict[str, list[str]]:
    """The processes ``up`` always runs, by name: each one's arguments to the Python
    interpreter. docker-compose.yml has a service for each (tests/test_compose.py)."""
    commands = {
        agent: ["manage.py", "runworker", agent, "--concurrency", str(concurrency)]
        for agent in agents
    }
    # daphne writes a line per request to the terminal unless told otherwise
    # (-v 0; Django's LOGGING still sets the level of every other log).
    log_options = ["--access-log", access_log] if access_log else ["-v", "0"]
    commands["web server"] = [
        "-m", "daphne", "-b", host, "-p", str(port), *log_options,
        "automechanica.asgi:application",
    ]  # fmt: skip
    commands["maintenance"] = ["manage.py", "runmaintenance"]
    commands["agent memory"] = ["manage.py", "runembedder"]
    return commands


def _stop_stages(names: Iterable[str]) -> list[list[str]]:
    """:data:`STOP_ORDER`'s stages, then every other process together."""
    names = list(names)
    first = [[name] for name in STOP_ORDER if name in names]
    return [*first, [name for name in names if name not in STOP_ORDER]]


def _local_url(host: str, port: int) -> str:
    """The server's address as seen from this machine (a wildcard bind is not one)."""
    if host in ("0.0.0.0", "::", "[::]", ""):
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address
    return f"http://{host}:{port}"


def _demo_token() -> str:
    """A fresh write token for the demo orchestrator; earlier demo tokens are revoked."""
    ApiToken.objects.filter(name=DEMO_TOKEN_NAME, revoked_at=None).update(revoked_at=timezone.now())
    return create_token(DEMO_TOKEN_NAME, "write")[1]
