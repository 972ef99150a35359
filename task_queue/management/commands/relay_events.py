"""``manage.py relay_events --to nats://HOST:PORT | amqp://USER:PASS@HOST/``."""

import asyncio
import logging
import os
import signal
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from task_queue.management.checks import ChecksWithoutUrls
from task_queue.relay.brokers import BrokerURLError, broker_module
from task_queue.relay.dispatcher import Dispatcher
from task_queue.relay.loop import BrokerUnavailable, Relay, RelayBusy
from task_queue.relay.names import NAMESPACE, Names, destination_key
from task_queue.sql.connections import probe_sessions_shared

logger = logging.getLogger("task_queue.relay")

# Under nats-py's 4,000 unconfirmed publishes, so a batch never waits on the client.
MAX_BATCH = 2000


# The destination, from the environment: a broker URL may carry a password.
DESTINATION_VARIABLE = "AUTOMECHANICA_RELAY_TO"


class Command(ChecksWithoutUrls, BaseCommand):
    help = (
        "Publish the event stream to NATS JetStream or RabbitMQ in order, with publisher "
        "confirms, resuming where the last run stopped. --consume-commands also turns "
        "cmd.task.execute.v1 commands from the broker into tasks; --dispatch publishes a "
        "cmd.agent.<Agent>.execute.v1 command for each task that becomes due."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--to",
            default=os.environ.get(DESTINATION_VARIABLE),
            metavar="URL",
            help="nats://HOST:PORT or amqp://USER:PASS@HOST/ (or $AUTOMECHANICA_RELAY_TO, "
            "which keeps a password out of the command line that ps shows)",
        )
        parser.add_argument("--once", action="store_true", help="relay what is pending, then exit")
        parser.add_argument(
            "--consume-commands",
            action="store_true",
            help="also turn cmd.task.execute.v1 commands into tasks (idempotent by message_id)",
        )
        parser.add_argument(
            "--dispatch",
            action="store_true",
            help="also publish cmd.agent.<Agent>.execute.v1 for each task that becomes due "
            "(for runworker --dispatch and remote agents; never a paused agent's tasks)",
        )
        parser.add_argument(
            "--batch", type=int, default=500, help=f"events per confirmed batch (1–{MAX_BATCH})"
        )
        parser.add_argument(
            "--poll", type=float, default=0.2, help="seconds between looks when idle"
        )
        parser.add_argument(
            "--confirm-timeout",
            type=float,
            default=10.0,
            help="seconds the broker has to confirm a batch before the relay reconnects",
        )
        parser.add_argument(
            "--namespace",
            default="",
            help="prefix for streams, subjects and exchanges, to share a broker (tests)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        url = options["to"]
        if not url:
            raise CommandError(f"a destination is needed: --to URL or ${DESTINATION_VARIABLE}")
        try:
            broker = broker_module(url, "--to")
        except BrokerURLError as error:
            raise CommandError(str(error)) from None
        if not 1 <= options["batch"] <= MAX_BATCH:
            raise CommandError(f"--batch: from 1 to {MAX_BATCH}")
        if options["poll"] <= 0 or options["confirm_timeout"] <= 0:
            raise CommandError("--poll and --confirm-timeout must be more than 0")
        namespace = options["namespace"]
        if not NAMESPACE.fullmatch(namespace):
            raise CommandError("--namespace: letters, digits, _ and - only")
        with connection.wrap_database_errors:  # (the probe alone: no warning logged)
            shared = probe_sessions_shared()
        if shared:
            raise CommandError(
                "relay_events holds a session lock (one relay per destination), which a "
                "pooler in transaction mode cannot keep: point its DATABASE_URL at "
                "PostgreSQL itself"
            )
        destination = destination_key(url, namespace)
        relay = Relay(
            broker.Bridge(url, Names(namespace), confirm_timeout=options["confirm_timeout"]),
            destination,
            batch=options["batch"],
            poll_seconds=options["poll"],
            once=options["once"],
            consume_commands=options["consume_commands"],
            dispatcher=Dispatcher(
                destination,
                batch=options["batch"],
                republish_seconds=settings.QUEUE_DISPATCH_REPUBLISH_SECONDS,
            )
            if options["dispatch"]
            else None,
        )
        try:
            stats = asyncio.run(self._run(relay))
        except (RelayBusy, BrokerUnavailable) as error:
            raise CommandError(str(error)) from None
        logger.info(
            "relayed %d events to %s (%.0f/s), at position %d; %d dispatched; %d commands, "
            "%d refused, %d broker outages",
            stats.relayed,
            destination,
            stats.rate(),
            stats.position,
            stats.dispatched,
            stats.commands,
            stats.refused,
            stats.outages,
        )

    async def _run(self, relay: Relay) -> Any:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        try:
            return await relay.run(stop)
        finally:
            # Given back while the loop is open: its close() shuts the pipe that carries
            # signals to it before it removes its handlers, and a signal in between (a
            # second SIGTERM) printed "Exception ignored when trying to write to the
            # signal wakeup fd" with a traceback.
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)
