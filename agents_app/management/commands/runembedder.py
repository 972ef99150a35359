"""``manage.py runembedder``: fill agent memory, embedding each AgentEvent's text
(``agents_app.memory``); any number of processes share the work."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents_app.embeddings import embed
from agents_app.memory import LEASE_SECONDS, run_embedder
from task_queue.management.checks import ChecksWithoutUrls
from task_queue.stop_signals import StopSignals


class Command(ChecksWithoutUrls, BaseCommand):
    help = "Consume embedding_jobs: embed each agent event's text into agent memory."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch", type=int, default=32, help="jobs per lease (32)")
        parser.add_argument("--poll", type=float, default=2.0, help="seconds between idle looks")
        parser.add_argument("--once", action="store_true", help="embed what is due, then exit")
        parser.add_argument(
            "--lease",
            type=float,
            default=LEASE_SECONDS,
            help=f"seconds a batch is leased for ({LEASE_SECONDS:g}); a job whose embedder "
            "died is given back after it",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["batch"] < 1:
            raise CommandError("--batch must be at least 1")
        if not options["lease"] > 0:  # False for NaN too
            raise CommandError("--lease must be a positive number of seconds")
        try:
            embed("check the embedder loads")
        except ValueError as error:
            raise CommandError(str(error)) from None
        with StopSignals() as stop:
            self.stdout.write(f"embedding agent events with {settings.AGENT_MEMORY_EMBEDDER!r}")
            stats = run_embedder(
                stop,
                batch=options["batch"],
                poll=options["poll"],
                once=options["once"],
                lease_seconds=options["lease"],
            )
        self.stdout.write(
            f"embedder stopped: {stats.embedded} embedded, {stats.failed} failed, "
            f"{stats.refused} refused (lease lost)"
        )
