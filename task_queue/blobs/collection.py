"""Deleting the blobs no row references any more (a maintenance job).

A blob (``task_queue.blobs``) is referenced from the ``*_ref`` columns of the tables
that hold large JSON values. The queue checks its own (tasks, workflows); apps above
it register checks for theirs (``register``; agents_app: agent events, messages,
publications, deliveries), so the queue never imports them.

A pass lists the storage and takes each blob older than ``PAYLOAD_BLOB_GRACE_SECONDS``
(by its modification time) as a candidate; a younger one is never deleted. Per batch
of candidates, in one transaction, it takes the blobs' advisory locks exclusively
(``locks.try_blob_locks``: a blob whose lock another transaction holds is skipped,
never waited for), asks every check which of the locked blobs a row references, and
deletes the others while still holding their locks.

Why a transaction about to reference a blob can never lose it: every writer gets its
blob through ``blobs.keep`` (or ``blobs.offload``), which takes the blob's lock
shared before it looks for the blob, and holds it until its transaction ends. If the
writer holds it first, the collector cannot lock the blob and skips it. If the
collector holds it first, the writer waits; the collector's reference checks run
after its lock was granted, so they see every reference committed by a writer that
held the lock before (PostgreSQL makes a commit visible before it releases the
transaction's locks); when the collector commits, the writer gets its lock, finds
the blob deleted and writes it again. The grace period covers what is written before
the transaction that references it begins: a worker writes a large result on its
handler thread, and its outcome writer keeps it later.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from task_queue import blobs
from task_queue.sql import blobs as blobs_sql
from task_queue.sql import locks

EVERY_SECONDS = 600.0  # the maintenance loop collects this often
BATCH = 200  # blobs locked, checked and deleted in one transaction

# Of the given references, those some row of the app's tables holds.
ReferenceCheck = Callable[[list[str]], set[str]]
_checks: dict[str, ReferenceCheck] = {}


def register(name: str, check: ReferenceCheck) -> None:
    """Add a check of the blob references in an app's tables to every pass."""
    _checks[name] = check


register("tasks and workflows", blobs_sql.referenced_by_queue)


def collect(*, now: datetime | None = None) -> int:
    """One pass: delete every blob older than the grace period that no row references
    (and partial writes as old, which a killed writer left); returns how many blobs."""
    cutoff = (now or timezone.now()) - timedelta(seconds=settings.PAYLOAD_BLOB_GRACE_SECONDS)
    storage = blobs.storage()
    deleted = 0
    candidates: list[str] = []
    for path in _older_than(cutoff):
        name = path.rpartition("/")[2]
        if not blobs.is_ref(name):
            storage.delete(path)  # a partial write: no row can reference it
            continue
        candidates.append(name)
        if len(candidates) == BATCH:
            deleted += _delete_unreferenced(candidates)
            candidates = []
    if candidates:
        deleted += _delete_unreferenced(candidates)
    return deleted


def _delete_unreferenced(refs: list[str]) -> int:
    """Lock what no one else holds, then delete what no row references, under the locks."""
    with transaction.atomic():
        locked = locks.try_blob_locks(refs)
        referenced: set[str] = set()
        for check in _checks.values():
            referenced |= check(locked)
        unreferenced = [ref for ref in locked if ref not in referenced]
        for ref in unreferenced:
            blobs.storage().delete(blobs.name_of(ref))
    return len(unreferenced)


def _older_than(cutoff: datetime) -> Iterator[str]:
    """The storage's blobs and partial writes last modified before ``cutoff``."""
    storage = blobs.storage()
    try:
        directories, _ = storage.listdir("")
    except FileNotFoundError:  # nothing stored yet
        return
    for directory in sorted(directories):
        for name in storage.listdir(directory)[1]:
            path = f"{directory}/{name}"
            wanted = blobs.is_ref(name) or name.startswith(blobs.PARTIAL)
            if wanted and storage.get_modified_time(path) < cutoff:
                yield path
