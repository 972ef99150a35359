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
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args: Any, **options: Any) -> None:
        for name in ("tasks", "workers", "concurrency", "latency_samples"):
            if options[name] < 1:
                raise CommandError(f"--{name.replace('_', '-')} must be at least 1")
        if options["latency_rate"] <= 0:
            raise CommandError("--latency-rate must be positive")
        report = run(
            BenchConfig(
                tasks=options["tasks"],
                workers=options["workers"],
                concurrency=options["concurrency"],
                latency_samples=options["latency_samples"],
                latency_rate=options["latency_rate"],
                remote=options["remote"],
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
        self.stdout.write(f"remote drain / in-process drain: {report['remote_to_in_process']}")

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
        self.stdout.write(
            f"per drained task: PostgreSQL {cost['postgres_cpu_us']} µs CPU, "
            f"workers {cost['worker_cpu_us']} µs CPU, {cost['wal_bytes']} WAL bytes"
        )
