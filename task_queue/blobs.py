"""Large payloads, stored content-addressed (seed 004) through Django's storage API.

A task's or message's payload whose JSON is larger than
``PAYLOAD_BLOB_THRESHOLD_BYTES`` is written to the ``payloads`` storage under its
SHA-256 (``sha256-<hex>``); the row keeps that reference in ``payload_ref`` and an
empty ``payload``. Readers (the worker, the API, message receivers) get the payload
back through :func:`payload_of`. A blob that is missing or does not match its hash
raises :class:`PayloadBlobMissing`, which the worker records as that task's failure;
a storage that fails to answer, :class:`PayloadBlobUnavailable`, a retried failure.

Blobs are not collected: one whose tasks and messages are gone stays in storage.

The blob is written before the row's transaction commits: a rolled-back enqueue
leaves an unreferenced blob behind, never a row without its blob.
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

PREFIX = "sha256-"
_REF = re.compile(r"sha256-[0-9a-f]{64}")


class PayloadBlobError(Exception):
    """A payload's blob could not be read."""


class PayloadBlobMissing(PayloadBlobError):
    """The blob is not in storage, or not what its hash says: reading again will not
    help (the worker fails the task without retrying)."""


class PayloadBlobUnavailable(PayloadBlobError):
    """The storage failed to answer (permissions, a network store down): the worker
    retries the task with backoff."""


def _storage() -> Storage:
    return storages["payloads"]


def _name(ref: str) -> str:
    # Two hex digits of fan-out keep directories small on a filesystem.
    return f"{ref[len(PREFIX) : len(PREFIX) + 2]}/{ref}"


def put(data: bytes) -> str:
    """Store ``data`` (once: equal content, equal name); returns its reference."""
    ref = PREFIX + hashlib.sha256(data).hexdigest()
    storage, name = _storage(), _name(ref)
    # A blob cut short (a disk filled up) is written again, not trusted by name.
    if not storage.exists(name) or storage.size(name) != len(data):
        storage.save(name, ContentFile(data))
    return ref


def get(ref: str) -> bytes:
    """The blob's bytes, checked against its hash."""
    if not _REF.fullmatch(ref):
        raise PayloadBlobMissing(f"payload reference {ref!r} is not sha256-<64 hex digits>")
    try:
        with _storage().open(_name(ref), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise PayloadBlobMissing(f"payload blob {ref} is missing from storage") from None
    except OSError as error:
        raise PayloadBlobUnavailable(f"payload blob {ref} could not be read: {error}") from None
    if PREFIX + hashlib.sha256(data).hexdigest() != ref:
        raise PayloadBlobMissing(f"payload blob {ref} does not match its hash")
    return data


def offload(payload_json: str) -> tuple[str, str | None]:
    """(payload JSON to keep in the row, blob reference or None) for a payload."""
    data = payload_json.encode()
    if len(data) <= settings.PAYLOAD_BLOB_THRESHOLD_BYTES:
        return payload_json, None
    return "{}", put(data)


def payload_of(payload: Any, ref: str | None) -> Any:
    """The payload a row stands for: its own, or its blob's."""
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
        fd, temporary = tempfile.mkstemp(dir=directory, prefix=".partial-")
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
