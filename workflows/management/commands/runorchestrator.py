"""``manage.py runorchestrator --api URL --token TOKEN``: the reference orchestrator."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from workflows.orchestrator.client import ApiClient, ApiError
from workflows.orchestrator.definitions import DefinitionError, load_all
from workflows.orchestrator.driver import Orchestrator


class Command(BaseCommand):
    help = (
        "Drive workflow definitions through the HTTP API: enqueue each step when the "
        "steps it depends on complete. Stateless: restart it at any time."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--api", required=True, help="the server, e.g. http://127.0.0.1:8000")
        parser.add_argument("--token", required=True, help="an API token with scope write")
        parser.add_argument(
            "--start", metavar="DEFINITION", help="start a workflow of this definition first"
        )
        parser.add_argument(
            "--input", default="{}", help="the started workflow's input: JSON, or @FILE"
        )
        parser.add_argument(
            "--definitions",
            action="append",
            default=[],
            type=Path,
            metavar="DIR",
            help="more *.json definitions (the built-in ones are always loaded)",
        )
        parser.add_argument("--poll", type=float, default=1.0, help="seconds between passes")
        parser.add_argument("--once", action="store_true", help="one pass, then exit")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            definitions = load_all(*options["definitions"])
        except (OSError, ValueError, DefinitionError) as error:
            raise CommandError(f"cannot load definitions: {error}") from None
        orchestrator = Orchestrator(ApiClient(options["api"], options["token"]))
        try:
            if name := options["start"]:
                if name not in definitions:
                    known = ", ".join(sorted(definitions))
                    raise CommandError(f"no definition {name!r}; known: {known}")
                workflow_id = orchestrator.start(definitions[name], _input(options["input"]))
                self.stdout.write(workflow_id)
            self._loop(orchestrator, options["poll"], options["once"])
        except ApiError as error:
            raise CommandError(str(error)) from None

    def _loop(self, orchestrator: Orchestrator, poll: float, once: bool) -> None:
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        while True:
            orchestrator.run_once()
            if once or stop.wait(poll):
                return


def _input(value: str) -> Any:
    try:
        text = Path(value[1:]).read_text() if value.startswith("@") else value
        return json.loads(text)
    except (OSError, ValueError) as error:
        raise CommandError(f"--input: {error}") from None
