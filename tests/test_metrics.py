"""Metric rollups from a seeded history whose every timestamp is chosen, so each
figure can be worked out by hand (the comments do)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.db.models import F

from task_queue import metrics, operations
from task_queue.models import HISTOGRAM_BOUNDS, RollupProgress, Task, TaskQueueMetric
from task_queue.operations import TaskSpec
from task_queue.sql import counts, db, locks, reading
from tests.support.database import plan_nodes
from tests.support.history import T0, at, seed_history
from tests.support.processes import run_manage
from tests.support.queue import complete_pending, fail_pending

pytestmark = pytest.mark.django_db(transaction=True)

ERRORS = ("Boom", "Timeout", "ValueError")


def histogram(counts: dict[int, int]) -> list[int]:
    """Slot j holds bounds[j-1] < v <= bounds[j] (Prometheus's le): 1 s is in slot 5
    (le 1), 2 s in 6 (le 2.5), 3, 4 and 5 s in 7 (le 5), 10 s in 8 (le 10)."""
    return [counts.get(slot, 0) for slot in range(len(HISTOGRAM_BOUNDS) + 1)]


# fmt: off
def expected_rows() -> dict[tuple[int, datetime], dict]:
    """The figures of seed_history, worked out by hand (percentiles interpolate).
    Queue wait is per attempt, from when it was due: A 5, C 1, B 3 then 10, D 1."""
    outcomes = ("tasks_created", "tasks_completed", "tasks_failed", "tasks_dead",
                "tasks_retried", "tasks_cancelled", "attempts")
    run_time = ("run_time_average", "run_time_p50", "run_time_p95")
    queue_wait = ("average_latency", "queue_wait_p50", "queue_wait_p95")
    minute_10 = {
        **dict(zip(outcomes, (4, 1, 1, 1, 1, 0, 4), strict=True)),
        **dict(zip(run_time, (2.5, 2.5, 3.85), strict=True)),  # 1 2 3 4
        **dict(zip(queue_wait, (2.5, 2.0, 4.7), strict=True)),  # 1 1 3 5
        "run_time_histogram": histogram({5: 1, 6: 1, 7: 2}), "run_time_sum": 10.0,
        "queue_wait_histogram": histogram({5: 2, 7: 2}), "queue_wait_sum": 10.0,
        "worker_heartbeat_delay": 15.0,
        "error_rates_per_agent": {e: {"count": 1, "rate": 0.25} for e in ERRORS},
    }
    minute_11 = {
        **dict(zip(outcomes, (0, 1, 0, 0, 0, 0, 1), strict=True)),
        **dict(zip(run_time, (4.0, 4.0, 4.0), strict=True)),
        **dict(zip(queue_wait, (10.0, 10.0, 10.0), strict=True)),
        "run_time_histogram": histogram({7: 1}), "run_time_sum": 4.0,
        "queue_wait_histogram": histogram({8: 1}), "queue_wait_sum": 10.0,
        "worker_heartbeat_delay": 75.0, "error_rates_per_agent": {},
    }
    whole = {
        **dict(zip(outcomes, (4, 2, 1, 1, 1, 0, 5), strict=True)),
        **dict(zip(run_time, (2.8, 3.0, 4.0), strict=True)),  # 1 2 3 4 4
        **dict(zip(queue_wait, (4.0, 3.0, 9.0), strict=True)),  # 1 1 3 5 10
        "run_time_histogram": histogram({5: 1, 6: 1, 7: 3}), "run_time_sum": 14.0,
        "queue_wait_histogram": histogram({5: 2, 7: 2, 8: 1}), "queue_wait_sum": 20.0,
        "worker_heartbeat_delay": 75.0,
        "error_rates_per_agent": {e: {"count": 1, "rate": 0.2} for e in ERRORS},
    }
    day = T0.replace(hour=0)
    return {
        (60, T0): minute_10, (60, at(60)): minute_11, (3600, T0): whole, (86400, day): whole,
    }
# fmt: on


def assert_figures(found: dict, expected: dict) -> None:
    for name, value in expected.items():
        if isinstance(value, float):
            assert found[name] == pytest.approx(value), name
        else:
            assert found[name] == value, name


def start_rollups_at_t0() -> None:
    for width in metrics.BUCKET_SECONDS:
        RollupProgress.objects.create(
            bucket_seconds=width, computed_until=metrics.bucket_floor(T0, width)
        )


def test_rollups_match_the_hand_computed_history():
    seed_history()
    start_rollups_at_t0()
    assert metrics.roll_up(now=at(26 * 3600)) is not None
    found = {(r["bucket_seconds"], r["bucket_start"]): r for r in rows_of_agent("EchoAgent")}
    assert set(found) == set(expected_rows())
    for key, expected in expected_rows().items():
        assert_figures(found[key], expected)
    # Each width went as far as its closed buckets (minutes: one pass's span).
    progress = dict(RollupProgress.objects.values_list("bucket_seconds", "computed_until"))
    assert progress == {60: T0 + metrics.MAX_SPAN[60], 3600: at(25 * 3600),
                        86400: T0.replace(hour=0) + timedelta(days=1)}  # fmt: skip


def test_recomputing_a_bucket_twice_gives_the_same_rows():
    seed_history()
    metrics.recompute(60, T0, at(60))
    metrics.recompute(3600, T0, T0)
    first = rows_of_agent("EchoAgent")
    metrics.recompute(60, T0, at(119))
    metrics.recompute(60, T0, at(61))
    metrics.recompute(3600, T0, T0)
    again = rows_of_agent("EchoAgent")
    assert again == first and len(first) == 3


def test_a_bucket_is_computed_only_once_closed():
    seed_history()
    start_rollups_at_t0()
    metrics.roll_up(now=at(80))  # 10:00 ended 20 s ago: within the grace, not yet
    assert not TaskQueueMetric.objects.exists()
    metrics.roll_up(now=at(95))  # now it has
    assert [r["bucket_start"] for r in rows_of_agent("EchoAgent")] == [T0]


def test_one_process_rolls_up_at_a_time():
    import psycopg
    from django.db import connection

    seed_history()
    start_rollups_at_t0()
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", [locks.ROLLUP])
        maintenance_once()  # another process holds the lock: it writes nothing
        assert not TaskQueueMetric.objects.exists()
        holder.execute("SELECT pg_advisory_unlock(%s)", [locks.ROLLUP])
    maintenance_once()
    assert {r["bucket_start"] for r in rows_of_agent("EchoAgent")} >= {T0, at(60)}


def maintenance_once() -> None:
    done = run_manage("runmaintenance", "--once")
    assert done.returncode == 0, done.stderr


def rows_of_agent(agent: str) -> list[dict]:
    fields = [f.name for f in TaskQueueMetric._meta.fields if f.name != "id"]
    return list(
        TaskQueueMetric.objects.filter(agent_name=agent)
        .order_by("bucket_seconds", "bucket_start")
        .values(*fields)
    )


def test_the_overview_and_the_api_count_what_finished_from_the_finish_counters():
    """The chart's minutes and the 1/5/15-minute windows come from the finish counters
    (queue 0028), to the 10 seconds, whatever the rollups say."""
    from automechanica.dashboard.overview import take_snapshot

    now = db.database_clock()
    TaskQueueMetric.objects.create(
        bucket_start=metrics.bucket_floor(now, 60) - timedelta(minutes=10), bucket_seconds=60,
        agent_name="EchoAgent", tasks_completed=7, tasks_dead=2,
    )  # fmt: skip
    operations.enqueue_many([TaskSpec("EchoAgent", "echo") for _ in range(4)])
    done = complete_pending("EchoAgent")
    operations.enqueue("EchoAgent", "echo", {})
    fail_pending("EchoAgent", retryable=False)
    # Finished 3, 10 and 20 minutes ago (the last outside every window), and over an
    # hour ago (outside the chart).
    for task_id, minutes in zip(done, (3, 10, 20, 65), strict=True):
        Task.objects.filter(id=task_id).update(
            finished_at=F("finished_at") - timedelta(minutes=minutes)
        )
    (activity,) = reading.recent_activity()
    assert (activity.agent_name, activity.completed, activity.failed) == (
        "EchoAgent", (0, 1, 2), (1, 1, 1),
    )  # fmt: skip
    charted = {minute: pair for minute, *pair in take_snapshot().minutes if pair != [0, 0]}
    finished = {
        metrics.bucket_floor(at, 60): status
        for at, status in Task.objects.values_list("finished_at", "status")
        if at >= metrics.bucket_floor(now, 60) - timedelta(minutes=59)
    }
    assert sorted(charted) == sorted(finished)  # not the rollup's minute
    assert sum(done for done, _ in charted.values()) == 3
    assert sum(failed for _, failed in charted.values()) == 1
    assert counts.drop_old_finish_buckets() == 0  # 65 minutes: still in reach
    Task.objects.filter(id=done[3]).update(finished_at=F("finished_at") - timedelta(minutes=10))
    db.execute(
        "INSERT INTO task_finish_counts VALUES (now() - interval '71 minutes', 'EchoAgent',"
        " 'completed', 0, 1)",
        {},
    )
    assert counts.drop_old_finish_buckets() == 1


def test_the_latency_percentiles_read_only_the_latest_finished_tasks():
    """However many tasks finished in the last 15 minutes, the percentiles read at most
    the sample's worth of them, newest first, from tasks_finished_idx."""
    operations.enqueue_many([TaskSpec("EchoAgent", "echo") for _ in range(60)])
    complete_pending("EchoAgent")
    db.execute("ANALYZE tasks", {})
    ((plan,),) = db.fetch(
        "EXPLAIN (ANALYZE, FORMAT JSON) " + reading.RECENT_TIMINGS, {"sample": 10}
    )
    scans = [node for node in plan_nodes(plan[0]["Plan"]) if node.get("Relation Name") == "tasks"]
    assert [scan["Index Name"] for scan in scans] == ["tasks_finished_idx"]
    assert scans[0]["Scan Direction"] == "Backward" and scans[0]["Actual Rows"] == 10
    (activity,) = reading.recent_activity()
    assert activity.completed[2] == 60 and activity.run_seconds is not None
    # A dead-letter task cancelled now, three hours after its last start: in the
    # sample, not in the run times.
    operations.enqueue("EchoAgent", "echo", {})
    ((failed_id, *_),) = fail_pending("EchoAgent", retryable=False)
    Task.objects.filter(id=failed_id).update(started_at=F("started_at") - timedelta(hours=3))
    operations.cancel([failed_id], actor="metrics-test")
    (activity,) = reading.recent_activity()
    assert activity.run_seconds is not None and activity.run_seconds[2] < 60
