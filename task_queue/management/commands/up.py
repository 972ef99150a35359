"""``manage.py up``: run the product on one machine.

Applies migrations (starting the embedded database when ``DATABASE_URL`` is unset),
then runs one ``runworker`` process per agent and supervises them: a worker that
dies is reported and the others are stopped. Ctrl-C (or SIGTERM) stops every worker
gracefully; a second Ctrl-C stops them at once. The dashboard issue adds the web
server, the first admin user and ``--demo`` here.
"""

import signal
import subprocess
import sys
import time
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents_app import registry


class Command(BaseCommand):
    help = "Migrate, then run a worker per agent until Ctrl-C."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--agents", nargs="+", metavar="AGENT", help="only these agents (default: all)"
        )
        parser.add_argument("--concurrency", type=int, default=10, help="per worker (10)")

    def handle(self, *args: Any, **options: Any) -> None:
        agents = options["agents"] or registry.names()
        unknown = sorted(set(agents) - set(registry.names()))
        if unknown:
            raise CommandError(f"unknown agent {', '.join(unknown)}")
        call_command("migrate", interactive=False, verbosity=0)
        self.stdout.write("database ready; starting workers: " + ", ".join(agents))
        workers = {
            agent: subprocess.Popen(
                [
                    sys.executable,
                    "manage.py",
                    "runworker",
                    agent,
                    "--concurrency",
                    str(options["concurrency"]),
                ],
                cwd=settings.BASE_DIR,
                # Their own session: a terminal's Ctrl-C reaches only this process,
                # which passes on one SIGTERM per Ctrl-C (two would skip the grace).
                start_new_session=True,
            )
            for agent in agents
        }
        stop_requests = 0

        def on_signal(signum: int, frame: object) -> None:
            nonlocal stop_requests
            stop_requests += 1
            for worker in workers.values():
                if worker.poll() is None:
                    worker.send_signal(signal.SIGTERM)  # the second one: exit at once

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        failed = None
        while any(w.poll() is None for w in workers.values()):
            if not stop_requests and failed is None:
                failed = next((a for a, w in workers.items() if w.poll() is not None), None)
                if failed is not None:
                    self.stderr.write(f"the {failed} worker exited; stopping the others")
                    on_signal(signal.SIGTERM, None)
            time.sleep(0.2)  # supervising child processes: nothing to wait on but them
        if failed is not None:
            raise CommandError(f"the {failed} worker exited with {workers[failed].returncode}")
        self.stdout.write("all workers stopped")
