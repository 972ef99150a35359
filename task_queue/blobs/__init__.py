"""Large JSON values, stored content-addressed (seed 004) through Django's storage API.

Every JSON value a client or an agent fills (a task's payload and result, a
workflow's metadata, a message's payload and metadata, a publication's payload and
metadata, a delivery's result) follows the same rules: larger than
``QUEUE_MAX_PAYLOAD_BYTES`` as JSON, it is refused (:func:`check_size`); larger than
``PAYLOAD_BLOB_THRESHOLD_BYTES``, it is written to the ``payloads`` storage under its
SHA-256 (``sha256-<hex>``) and the row keeps that reference in the column's ``_ref``
companion (``payload_ref``, ``result_ref``, ``metadata_ref``) instead of the value
(:func:`offload`). Readers get the value back through :func:`payload_of`. A blob that
is missing or does not match its hash raises :class:`PayloadBlobMissing`, which the
worker records as that task's failure; a storage that fails to answer,
:class:`PayloadBlobUnavailable`, a retried failure.

Blobs no row references any more are deleted by the maintenance loop
(``task_queue.blobs.collection``), once older than ``PAYLOAD_BLOB_GRACE_SECONDS``.
What makes that safe against a transaction about to reference a blob: such a
transaction writes (or finds) the blob only through :func:`offload` or
:func:`keep`, which first take the blob's advisory lock *shared*
(``task_queue.sql.locks.BLOBS``) and hold it until the transaction ends. The
collector takes a blob's lock *exclusively*, without waiting, and only then looks for
references and deletes. So either the writer got its lock first (the collector skips
the blob; by the time the lock is free the reference is committed, or rolled back and
the blob is unreferenced again), or the collector did (the writer waits, then finds
the blob gone and writes it again). A blob is written before the row's transaction
commits: a rolled-back transaction leaves an unreferenced blob behind (collected
later), never a row without its blob.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from typing import Any

from django.conf import settings
from django.core.files.base import ContentFile, File
from django.core.files.storage import FileSystemStorage, Storage, storages
from django.db import connection

from task_queue.sql import locks

PREFIX = "sha256-"
PARTIAL = ".partial-"  # a blob being written (AtomicFileSystemStorage)
_REF = re.compile(r"sha256-[0-9a-f]{64}")


class TooLarge(ValueError):
    """A JSON value is larger than ``QUEUE_MAX_PAYLOAD_BYTES``."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"is {size} bytes as JSON; the limit is {limit}")
        self.size = size
        self.limit = limit


class PayloadBlobError(Exception):
    """A payload's blob could not be read."""


class PayloadBlobMissing(PayloadBlobError):
    """The blob is not in storage, or not what its hash says: reading again will not
    help (the worker fails the task without retrying)."""


class PayloadBlobUnavailable(PayloadBlobError):
    """The storage failed to answer (permissions, a network store down): the worker
    retries the task with backoff."""


def storage() -> Storage:
    return storages["payloads"]


def name_of(ref: str) -> str:
    """The blob's name in the storage."""
    # Two hex digits of fan-out keep directories small on a filesystem.
    return f"{ref[len(PREFIX) : len(PREFIX) + 2]}/{ref}"


def is_ref(text: str) -> bool:
    return _REF.fullmatch(text) is not None


def reference(data: bytes) -> str:
    return PREFIX + hashlib.sha256(data).hexdigest()


def check_size(json_text: str) -> str:
    """``json_text`` if it is within ``QUEUE_MAX_PAYLOAD_BYTES``; :class:`TooLarge` if not."""
    size, limit = len(json_text.encode()), settings.QUEUE_MAX_PAYLOAD_BYTES
    if size > limit:
        raise TooLarge(size, limit)
    return json_text


def put(data: bytes) -> str:
    """Store ``data`` (once: equal content, equal name); returns its reference.

    Nothing keeps the blob from the collector: a row that will reference it must get
    it through :func:`keep` (or :func:`offload`) in its own transaction."""
    ref = reference(data)
    storage_, name = storage(), name_of(ref)
    # A blob cut short (a disk filled up) is written again, not trusted by name.
    if not storage_.exists(name) or storage_.size(name) != len(data):
        storage_.save(name, ContentFile(data))
    return ref


def keep(data: bytes) -> str:
    """Store ``data`` for a row the current transaction is writing; its reference.

    The blob's lock is held (shared) from before the blob is looked for until the
    transaction ends, so the collector cannot delete it in between (module docstring)."""
    if not connection.in_atomic_block:
        raise RuntimeError("blobs.keep needs the transaction that writes the reference")
    locks.share_blob_locks([reference(data)])
    return put(data)


def get(ref: str) -> bytes:
    """The blob's bytes, checked against its hash."""
    if not is_ref(ref):
        raise PayloadBlobMissing(f"payload reference {ref!r} is not sha256-<64 hex digits>")
    try:
        with storage().open(name_of(ref), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise PayloadBlobMissing(f"payload blob {ref} is missing from storage") from None
    except OSError as error:
        raise PayloadBlobUnavailable(f"payload blob {ref} could not be read: {error}") from None
    if PREFIX + hashlib.sha256(data).hexdigest() != ref:
        raise PayloadBlobMissing(f"payload blob {ref} does not match its hash")
    return data


def offload(json_text: str, *, empty: str | None = "{}") -> tuple[str | None, str | None]:
    """(JSON to keep in the row, blob reference or None) for a value the current
    transaction writes: over the blob threshold, ``empty`` and the blob (:func:`keep`)."""
    data = json_text.encode()
    return (empty, keep(data)) if needs_blob(data) else (json_text, None)


def needs_blob(data: bytes) -> bool:
    """Whether a value's JSON is over ``PAYLOAD_BLOB_THRESHOLD_BYTES``."""
    return len(data) > settings.PAYLOAD_BLOB_THRESHOLD_BYTES


def payload_of(payload: Any, ref: str | None) -> Any:
    """The value a row stands for (a payload, a result, metadata): its own, or its
    blob's."""
    return payload if ref is None else json.loads(get(ref))


class AtomicFileSystemStorage(FileSystemStorage):
    """A filesystem storage whose files appear whole or not at all (a temporary file
    in the same directory, then a rename), and where saving an existing name
    replaces it: names are content hashes, so the content is the same. Payloads are
    the tasks' data: its directories are its owner's alone (0700), its files 0600."""

    def get_available_name(self, name: str, max_length: int | None = None) -> str:
        return name

    def _save(self, name: str, content: File) -> str:
        path = self.path(name)
        directory = os.path.dirname(path)
        self._make_private(directory)
        # mkstemp creates the file 0600, and the rename keeps that.
        fd, temporary = tempfile.mkstemp(dir=directory, prefix=PARTIAL)
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in content.chunks():
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
        return name

    def _make_private(self, directory: str) -> None:
        """Create the storage's root and the directories down to ``directory`` 0700;
        make any of them that others may open (made before this rule) 0700 too."""
        root = os.path.abspath(self.location)
        os.makedirs(os.path.dirname(root), exist_ok=True)
        levels = [root]
        below = os.path.relpath(directory, root)
        if below != os.curdir:
            for part in below.split(os.sep):
                levels.append(os.path.join(levels[-1], part))
        for level in levels:
            try:
                os.mkdir(level, 0o700)
            except FileExistsError:
                if os.stat(level).st_mode & 0o077:
                    os.chmod(level, 0o700)
