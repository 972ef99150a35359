"""``manage.py runworker AGENT [AGENT ...]``: lease and run tasks of these agents."""

import gc
import logging
import os
import signal
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from task_queue import registry
from task_queue.management.checks import ChecksWithoutUrls
from task_queue.relay.brokers import BrokerURLError, broker_module
from task_queue.relay.follower import Follower
from task_queue.relay.names import NAMESPACE, Names
from task_queue.worker import MonitorFailed, Worker, WorkerConfig

logger = logging.getLogger("task_queue.worker")
# Where --dispatch can come from instead: a broker URL may carry a password.
DISPATCH_VARIABLE = "AUTOMECHANICA_DISPATCH_FROM"
# How long a second signal waits for the database to take the leases back.
ABANDON_SECONDS = 2.0


def _positive_float(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise ValueError(value)
    return number


class Command(ChecksWithoutUrls, BaseCommand):
    help = (
        "Run a worker for the named agents. SIGTERM/SIGINT stop it gracefully (in-flight "
        "tasks get the grace period, the rest are released); a second signal gives every "
        "task back and exits at once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("agents", nargs="+", metavar="AGENT")
        parser.add_argument("--concurrency", type=int, default=10, help="handler threads (10)")
        parser.add_argument("--burst", action="store_true", help="exit once nothing is due")
        parser.add_argument("--max-tasks", type=int, help="exit after running this many tasks")
        parser.add_argument(
            "--lease",
            type=_positive_float,
            default=settings.QUEUE_LEASE_SECONDS,
            help="lease length in seconds; heartbeats come every third of it",
        )
        parser.add_argument(
            "--poll",
            type=_positive_float,
            default=settings.QUEUE_POLL_SECONDS,
            help="seconds between polls when no notification comes",
        )
        parser.add_argument(
            "--reaper-interval",
            type=_positive_float,
            default=settings.QUEUE_REAPER_SECONDS,
            help="seconds between reaper passes",
        )
        parser.add_argument(
            "--grace",
            type=float,
            default=settings.QUEUE_SHUTDOWN_GRACE_SECONDS,
            help="seconds in-flight tasks get to finish on shutdown",
        )
        parser.add_argument(
            "--dispatch",
            metavar="URL",
            default=os.environ.get(DISPATCH_VARIABLE),
            help="take work from relay_events --dispatch's commands on nats://… or amqp://… "
            f"(or ${DISPATCH_VARIABLE}), claiming by itself only every --poll seconds",
        )
        parser.add_argument(
            "--namespace",
            default="",
            help="the broker names' prefix, as relay_events --namespace",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        unknown = [name for name in options["agents"] if name not in registry.names()]
        if unknown:
            known = ", ".join(registry.names())
            raise CommandError(f"unknown agent {', '.join(unknown)}; known agents: {known}")
        if options["concurrency"] < 1:
            raise CommandError("--concurrency must be at least 1")
        if options["max_tasks"] is not None and options["max_tasks"] < 1:
            raise CommandError("--max-tasks must be at least 1")
        stale = settings.QUEUE_STALE_WORKER_SECONDS
        if options["lease"] / 3 >= stale:
            # The reaper would forget this worker between two of its heartbeats.
            raise CommandError(
                f"--lease {options['lease']:g}: heartbeats every {options['lease'] / 3:g} s "
                f"must come within QUEUE_STALE_WORKER_SECONDS ({stale:g} s)"
            )
        dispatch = None
        if options["dispatch"]:
            if not NAMESPACE.fullmatch(options["namespace"]):
                raise CommandError("--namespace: letters, digits, _ and - only")
            try:
                broker = broker_module(options["dispatch"], "--dispatch")
            except BrokerURLError as error:
                raise CommandError(str(error)) from None
            source = broker.DispatchSource(options["dispatch"], Names(options["namespace"]))
            dispatch = partial(
                Follower, source, agents=options["agents"], prefetch=options["concurrency"]
            )
        worker = Worker(
            WorkerConfig(
                agents=options["agents"],
                concurrency=options["concurrency"],
                lease_seconds=options["lease"],
                poll_seconds=options["poll"],
                reaper_seconds=options["reaper_interval"],
                grace_seconds=options["grace"],
                burst=options["burst"],
                max_tasks=options["max_tasks"],
                dispatch=dispatch,
            )
        )
        restore_signals = self._install_signal_handlers(worker)
        # What is loaded by now (Django, the apps, the agents) lives as long as the
        # process: kept out of the garbage collector's full passes, which would
        # otherwise walk all of it every few thousand tasks.
        gc.freeze()
        try:
            report = worker.run()
        except MonitorFailed as error:
            raise CommandError(
                f"worker {worker.id} stopped: its monitor failed ({error})"
            ) from None
        finally:
            restore_signals()
        logger.info(
            "worker %s stopped: %d claimed, %d outcomes written (%d refused), %d released",
            worker.id,
            report.claimed,
            report.written,
            report.refused,
            report.released,
        )

    def _install_signal_handlers(self, worker: Worker) -> Callable[[], None]:
        """Take SIGTERM/SIGINT until the returned function gives them back.

        The handler only writes the signal number to a pipe: it runs between two
        bytecodes of the main thread, which may be holding the very lock that
        ``Event.set`` needs. A relay thread reads the pipe and stops the worker.
        """
        if threading.current_thread() is not threading.main_thread():
            return lambda: None  # called in-process from a thread: signals are not ours
        read_end, write_end = os.pipe()

        def relay() -> None:
            with os.fdopen(read_end, "rb", buffering=0) as signals:
                if not (first := signals.read(1)):
                    return  # the worker finished and closed the pipe
                name = signal.Signals(first[0]).name
                logger.info("%s: stopping after in-flight tasks", name)
                worker.request_stop()
                if second := signals.read(1):
                    logger.warning("%s again: exiting at once", signal.Signals(second[0]).name)
                    # The handlers die with the process; their tasks are given back
                    # first, unless the database does not answer within the bound.
                    code = 128 + second[0]
                    deadline = threading.Timer(ABANDON_SECONDS, os._exit, args=(code,))
                    deadline.daemon = True
                    deadline.start()
                    worker.abandon()
                    os._exit(code)

        threading.Thread(target=relay, name="signal-relay", daemon=True).start()

        def on_signal(signum: int, frame: object) -> None:
            os.write(write_end, bytes([signum]))

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}

        def restore() -> None:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            os.close(write_end)

        return restore
