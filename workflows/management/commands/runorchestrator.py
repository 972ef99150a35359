"""``manage.py runorchestrator --api URL [--token TOKEN]``: the reference orchestrator."""

from __future__ import annotations

import json
import logging
import os
import random
import time
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from task_queue.management.checks import ChecksWithoutUrls
from task_queue.stop_signals import StopSignals
from workflows.orchestrator.client import TOKEN_VARIABLE, ApiClient, ApiError
from workflows.orchestrator.definitions import Definition, DefinitionError, load_all
from workflows.orchestrator.demo import demo_feed
from workflows.orchestrator.driver import Orchestrator
from workflows.orchestrator.follow import UNAVAILABLE, EventStream

logger = logging.getLogger(__name__)

DEMO_DEFINITION = "supplier_onboarding"
# Following the stream: the longest wait for an event (the loop then looks at its
# stop signal), and the wait before connecting again while it is unavailable.
STREAM_WAIT = 1.0
RECONNECT_SECONDS = 10.0
FIRST_RECONNECT_SECONDS = 0.5


class Command(ChecksWithoutUrls, BaseCommand):
    help = (
        "Drive workflow definitions through the HTTP API: enqueue each step when the "
        "steps it depends on complete. Stateless: restart it at any time."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--api", required=True, help="the server, e.g. http://127.0.0.1:8000")
        parser.add_argument(
            "--token",
            default=os.environ.get(TOKEN_VARIABLE),
            help=f"an API token with scope write (default: ${TOKEN_VARIABLE}, which keeps "
            "it out of the process list)",
        )
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
        parser.add_argument(
            "--poll",
            type=float,
            default=1.0,
            help="seconds between passes, when polling (the stream unavailable, or --no-stream)",
        )
        parser.add_argument(
            "--no-stream",
            action="store_true",
            help="poll the API instead of following its live stream (/api/v1/stream)",
        )
        parser.add_argument("--once", action="store_true", help="one pass, then exit")
        parser.add_argument(
            "--demo-every",
            type=float,
            metavar="SECONDS",
            help="also start a supplier_onboarding workflow of a generated feed this often "
            "(some of its parts fail fitment, for the dead letter)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["token"]:
            raise CommandError(f"an API token is needed: --token or ${TOKEN_VARIABLE}")
        try:
            definitions = load_all(*options["definitions"])
        except (OSError, ValueError, DefinitionError) as error:
            raise CommandError(f"cannot load definitions: {error}") from None
        with StopSignals() as stop:
            self._run(options, definitions, stop)

    def _run(self, options: dict[str, Any], definitions: dict, stop: StopSignals) -> None:
        orchestrator = Orchestrator(ApiClient(options["api"], options["token"], stop=stop))
        stream = None
        if not (options["no_stream"] or options["once"]):
            stream = EventStream(options["api"], options["token"])
        try:
            if name := options["start"]:
                if name not in definitions:
                    known = ", ".join(sorted(definitions))
                    raise CommandError(f"no definition {name!r}; known: {known}")
                workflow_id = orchestrator.start(definitions[name], _input(options["input"]))
                self.stdout.write(workflow_id)
            demo = None
            if options["demo_every"]:
                if DEMO_DEFINITION not in definitions:
                    raise CommandError(f"--demo-every needs the {DEMO_DEFINITION} definition")
                demo = (definitions[DEMO_DEFINITION], options["demo_every"])
            self._loop(orchestrator, stop, options["poll"], options["once"], demo, stream)
        except ApiError as error:
            raise CommandError(str(error)) from None
        finally:
            if stream is not None:
                stream.close()

    def _loop(
        self,
        orchestrator: Orchestrator,
        stop: StopSignals,
        poll: float,
        once: bool,
        demo: tuple[Definition, float] | None,
        stream: EventStream | None = None,
    ) -> None:
        """Follow ``stream`` when it is given and available; poll every ``poll``
        seconds otherwise."""
        rng = random.Random()
        next_demo = time.monotonic()
        follower = _Follower(stream) if stream is not None else None
        while True:
            try:
                if demo and time.monotonic() >= next_demo:
                    orchestrator.start(demo[0], demo_feed(rng), name="demo supplier feed")
                    next_demo = time.monotonic() + demo[1]
                if follower is not None and follower.available(orchestrator):
                    until_demo = next_demo - time.monotonic() if demo else STREAM_WAIT
                    follower.follow(orchestrator, max(0.0, min(STREAM_WAIT, until_demo)))
                    if stop.is_set():
                        return
                    continue
                orchestrator.run_once()
            except OSError as error:  # the server stayed unreachable through the retries
                if once:
                    raise CommandError(f"cannot reach the API: {error}") from None
                logger.warning("cannot reach the API (%s); trying again", error)
            except ApiError as error:
                if once or error.status < 500:  # a refused token will not get better
                    raise
                logger.warning("the API failed (%s); trying again", error)
            if once or stop.wait(poll):
                return


class _Follower:
    """The stream, reconnected when it drops: a connect that could not resume makes
    one polling pass (what changed before it), and while it cannot connect, the loop
    polls and tries again, after half a second, then twice as long each time up to
    ``RECONNECT_SECONDS``."""

    def __init__(self, stream: EventStream) -> None:
        self.stream = stream
        self.retry_at = 0.0
        self.backoff = FIRST_RECONNECT_SECONDS
        self.warned = False

    def available(self, orchestrator: Orchestrator) -> bool:
        if self.stream.socket is not None:
            return True
        if time.monotonic() < self.retry_at:
            return False
        try:
            resumed = self.stream.connect()
        except UNAVAILABLE as error:
            # Soon at first (a server still starting), then every RECONNECT_SECONDS.
            self.retry_at = time.monotonic() + self.backoff
            self.backoff = min(self.backoff * 2, RECONNECT_SECONDS)
            if not self.warned:
                logger.warning("the live stream is unavailable (%s); polling", error)
                self.warned = True
            return False
        logger.info("following the live stream %s", self.stream.url)
        self.warned = False
        self.backoff = FIRST_RECONNECT_SECONDS
        if not resumed:
            orchestrator.run_once()
        return True

    def follow(self, orchestrator: Orchestrator, timeout: float) -> None:
        try:
            events = self.stream.receive(timeout)
        except UNAVAILABLE as error:
            logger.warning("the live stream dropped (%s); reconnecting", error)
            return
        orchestrator.on_events(events)


def _input(value: str) -> Any:
    try:
        text = Path(value[1:]).read_text() if value.startswith("@") else value
        return json.loads(text)
    except (OSError, ValueError) as error:
        raise CommandError(f"--input: {error}") from None
