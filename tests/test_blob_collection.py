"""The blob collector: deletes old blobs no row references, never a young one, and
never one that a transaction in flight is about to reference."""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from agents_app import messaging
from task_queue import blobs, operations
from task_queue.blobs import collection as blob_collection
from task_queue.models import Task
from task_queue.sql import locks
from tests.support.waiting import wait_for

LARGE = {"feed": "x" * 100_000}
LATER = timedelta(hours=2)  # past the default grace period of an hour


def stored(blob_dir) -> set[str]:
    return {path.name for path in blob_dir.rglob("sha256-*")}


@pytest.mark.django_db
def test_unreferenced_blobs_go_once_past_the_grace_period(blob_dir):
    kept_task = operations.enqueue("EchoAgent", "echo", LARGE).id
    messaging.send("Planner", "Pricer", "data_share", {}, metadata={"other": "m" * 100_000})
    gone_task = operations.enqueue("EchoAgent", "echo", {"another": "y" * 100_000}).id
    orphan = Task.objects.get(id=gone_task).payload_ref
    Task.objects.filter(id=gone_task).delete()
    partial = next(blob_dir.iterdir()) / f"{blobs.PARTIAL}left-by-a-killed-writer"
    partial.write_bytes(b"half")
    assert len(stored(blob_dir)) == 3

    # Younger than the grace period: nothing goes, referenced or not.
    assert blob_collection.collect() == 0
    assert len(stored(blob_dir)) == 3 and partial.exists()

    assert blob_collection.collect(now=timezone.now() + LATER) == 1
    assert orphan not in stored(blob_dir) and len(stored(blob_dir)) == 2
    assert not partial.exists()
    assert Task.objects.get(id=kept_task).payload_ref in stored(blob_dir)
    # What is left is referenced by a task and by a message (agents_app's check).
    assert blob_collection.collect(now=timezone.now() + LATER) == 0


@pytest.mark.django_db
def test_the_grace_period_is_a_setting(blob_dir, settings):
    task_id = operations.enqueue("EchoAgent", "echo", LARGE).id
    Task.objects.filter(id=task_id).delete()
    settings.PAYLOAD_BLOB_GRACE_SECONDS = 3 * 3600
    assert blob_collection.collect(now=timezone.now() + LATER) == 0
    settings.PAYLOAD_BLOB_GRACE_SECONDS = 0
    assert blob_collection.collect() == 1 and not stored(blob_dir)


@pytest.mark.django_db(transaction=True)
def test_a_blob_an_enqueue_in_flight_references_is_never_deleted(blob_dir, settings):
    """The blob exists already (old, unreferenced: its task was deleted), an enqueue of
    the same payload finds it and has not committed yet while the collector runs."""
    settings.PAYLOAD_BLOB_GRACE_SECONDS = 0
    first = operations.enqueue("EchoAgent", "echo", LARGE).id
    ref = Task.objects.get(id=first).payload_ref
    Task.objects.filter(id=first).delete()
    old = time.time() - 7200
    [path] = blob_dir.rglob(ref)
    os.utime(path, (old, old))

    referenced, release = threading.Event(), threading.Event()
    enqueued = []

    def enqueue_and_wait() -> None:
        try:
            with transaction.atomic():
                enqueued.append(operations.enqueue("EchoAgent", "echo", LARGE).id)
                referenced.set()
                release.wait(30)
        finally:
            connection.close()

    writer = threading.Thread(target=enqueue_and_wait)
    writer.start()
    try:
        assert referenced.wait(30)
        assert not Task.objects.filter(id__in=enqueued).exists()  # not committed yet
        assert blob_collection.collect() == 0
        assert path.exists()
    finally:
        release.set()
        writer.join(30)
    assert Task.objects.get(id=enqueued[0]).payload_ref == ref
    assert blob_collection.collect() == 0 and path.exists()  # now referenced, committed
    assert blobs.get(ref)


@pytest.mark.django_db(transaction=True)
def test_a_writer_waits_for_the_collector_and_writes_the_blob_again(blob_dir, settings):
    """The other order: the collector holds the blob's lock (it is deleting it) when an
    enqueue of the same payload comes; the enqueue waits, then writes the blob anew."""
    settings.PAYLOAD_BLOB_GRACE_SECONDS = 0
    first = operations.enqueue("EchoAgent", "echo", LARGE).id
    ref = Task.objects.get(id=first).payload_ref
    Task.objects.filter(id=first).delete()
    enqueued = []

    def enqueue() -> None:
        try:
            enqueued.append(operations.enqueue("EchoAgent", "echo", LARGE).id)
        finally:
            connection.close()

    with transaction.atomic():
        assert locks.try_blob_locks([ref]) == [ref]
        writer = threading.Thread(target=enqueue)
        writer.start()
        wait_for(_waiting_for_a_lock, what="the enqueue waiting for the blob's lock")
        blobs.storage().delete(blobs.name_of(ref))  # what the collector does under the lock
    writer.join(30)
    assert blobs.get(ref) and Task.objects.get(id=enqueued[0]).payload_ref == ref


def _waiting_for_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        return cursor.fetchone()[0] > 0
