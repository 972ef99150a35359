"""Files only their owner may read, written whole or not at all.

``tempfile.mkstemp`` creates the file 0600 from the start, so there is no moment in
which it is readable by others; the content is written and synced before the file
takes its name, so no reader ever sees it empty or half-written.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def _written(directory: Path, text: str) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".private-")
    _write_synced(handle, text)
    return temporary


def _write_synced(handle: int, text: str) -> None:
    with os.fdopen(handle, "w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())


def create_private_file(path: Path, text: str) -> bool:
    """Write ``path`` unless it exists (then leave it: another process won the race);
    True if this call wrote it."""
    temporary = _written(path.parent, text)
    try:
        os.link(temporary, path)  # fails if the name is taken: the first one stays
        return True
    except FileExistsError:
        return False
    except OSError:  # a filesystem without hard links: create the name exclusively
        return _create_exclusively(path, text)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def _create_exclusively(path: Path, text: str) -> bool:
    try:
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    _write_synced(handle, text)
    return True


def replace_private_file(path: Path, text: str) -> Path:
    """Write ``path``, replacing what was there."""
    os.replace(_written(path.parent, text), path)
    return path
