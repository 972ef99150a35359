"""``manage.py queue_bench``: enqueue and drain throughput, and pickup latency."""

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from task_queue.bench import BenchConfig, run


class Command(BaseCommand):
    help = (
        "Benchmark the queue with real worker processes running EchoAgent tasks. Run it on "
        "a quiet queue: the workers also take any other EchoAgent task."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tasks", type=int, default=20_000, help="tasks to drain (20000)")
        parser.add_argument("--workers", type=int, default=2, help="worker processes (2)")
        parser.add_argument("--concurrency", type=int, default=50, help="per worker (50)")
        parser.add_argument("--latency-samples", type=int, default=200)
        parser.add_argument("--latency-rate", type=float, default=50.0, help="tasks/s (50)")
        parser.add_argument(
            "--remote",
            action="store_true",
            help="drain again with remote agents (the agent client, over a real daphne) "
            "and report both and their ratio",
        )
        parser.add_argument(
            "--rounds",
            type=int,
            default=1,
            help="with --remote: drain both ways this many times, each first every other "
            "time, and report the median round (1)",
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args: Any, **options: Any) -> None:
        for name in ("tasks", "workers", "concurrency", "latency_samples", "rounds"):
            if options[name] < 1:
                raise CommandError(f"--{name.replace('_', '-')} must be at least 1")
        if options["latency_rate"] <= 0:
            raise CommandError("--latency-rate must be positive")
        if options["rounds"] > 1 and not options["remote"]:
            raise CommandError("--rounds compares two ways of draining: it needs --remote")
        report = run(
            BenchConfig(
                tasks=options["tasks"],
                workers=options["workers"],
                concurrency=options["concurrency"],
                latency_samples=options["latency_samples"],
                latency_rate=options["latency_rate"],
                remote=options["remote"],
                rounds=options["rounds"],
            )
        )
        if options["json"]:
            self.stdout.write(json.dumps(report, indent=2))
            return
        if not options["remote"]:
            self._show(report)
            return
        self.stdout.write("in-process workers (runworker):")
        self._show(report["in_process"])
        self.stdout.write("remote agents (the agent client over HTTP):")
        self._show(report["remote"])
        for number, each in enumerate(report.get("rounds", []), 1):
            self.stdout.write(
                f"round {number}: in-process {each['in_process_drain_tasks_per_s']}, "
                f"remote {each['remote_drain_tasks_per_s']} tasks/s, "
                f"ratio {each['remote_to_in_process']}"
            )
        median = " (the median round, shown above)" if "rounds" in report else ""
        self.stdout.write(
            f"remote drain / in-process drain: {report['remote_to_in_process']}{median}"
        )

    def _show(self, report: dict[str, Any]) -> None:
        latency = report["pickup_latency_ms"]
        self.stdout.write(
            f"enqueue {report['enqueue_tasks_per_s']} tasks/s, "
            f"drain {report['drain_tasks_per_s']} tasks/s "
            f"({report['workers']} workers × {report['concurrency']}), "
            f"pickup p50 {latency['p50']} ms, p95 {latency['p95']} ms, p99 {latency['p99']} ms "
            f"(to completion: p50 {report['done_latency_ms']['p50']} ms, "
            f"p99 {report['done_latency_ms']['p99']} ms)"
        )
        cost = report["drain_cost_per_task"]
        server = f"daphne {cost['server_cpu_us']} µs CPU, " if "server_cpu_us" in cost else ""
        self.stdout.write(
            f"per drained task: PostgreSQL {cost['postgres_cpu_us']} µs CPU, "
            f"workers {cost['worker_cpu_us']} µs CPU, {server}{cost['wal_bytes']} WAL bytes"
        )
