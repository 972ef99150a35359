"""``manage.py export_events [--since SEQ|--since-time T] [--follow] [--output FILE]``."""

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.dateparse import parse_datetime

from task_queue.event_export import Exported, export, resume_position
from task_queue.management.checks import ChecksWithoutUrls
from task_queue.stop_signals import StopSignals


class Command(ChecksWithoutUrls, BaseCommand):
    help = (
        "Write the event stream as JSON lines, in order. With --output, a rerun appends "
        "after the file's last event: no repeats, no gaps. --follow waits for new "
        "events (like tail -f) until SIGINT or SIGTERM."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        start = parser.add_mutually_exclusive_group()
        start.add_argument(
            "--since", type=int, metavar="SEQ", help="start after this stream position"
        )
        start.add_argument(
            "--since-time",
            metavar="T",
            help="only events emitted at or after this ISO 8601 time (UTC if no zone)",
        )
        parser.add_argument("--follow", action="store_true", help="keep waiting for events")
        parser.add_argument(
            "--output", metavar="FILE", help="append to this file (standard output if absent)"
        )
        parser.add_argument(
            "--poll", type=float, default=0.5, help="seconds between looks while following"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        since_time = _since_time(options["since_time"])
        if options["since"] is not None and options["since"] < 0:
            raise CommandError("--since: a stream position is 0 or more")
        if options["poll"] <= 0:
            raise CommandError("--poll: must be more than 0")
        after = options["since"] or 0
        with StopSignals() as stop:
            run = {"since_time": since_time, "follow": options["follow"], "stop": stop}
            run["poll_seconds"] = options["poll"]
            done = self._export(options["output"], after, run)
        if done.pruned:
            first, last = done.pruned
            self.stderr.write(
                f"warning: positions {first}–{last} were pruned (retention) before this "
                "export reached them"
            )

    def _export(self, output: str | None, after: int, run: dict[str, Any]) -> Exported:
        if not output:
            done = export(sys.stdout.buffer, after=after, **run)
            self.stderr.write(f"exported {done.events} events")
            return done
        path = Path(output)
        try:
            resume = resume_position(path)
            if resume and after > resume:
                raise CommandError(
                    f"--since {after}: {path} ends at position {resume}; appending from "
                    f"{after} would leave a gap (use another file)"
                )
            after = max(after, resume)
            with path.open("ab") as out:
                done = export(out, after=after, sync=True, **run)
        except (OSError, ValueError) as error:
            raise CommandError(str(error)) from None
        if done.events:
            self.stderr.write(
                f"exported {done.events} events to {path} (positions {done.first}–{done.last})"
            )
        else:
            self.stderr.write(f"no events after position {after}; {path} unchanged")
        return done


def _since_time(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        moment = parse_datetime(text)
    except ValueError:
        moment = None
    if moment is None:
        raise CommandError(f"--since-time: not an ISO 8601 time: {text!r}")
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment
