"""JSON lines export of the event stream (seed 004), resumable from its own output.

The output file is the bookmark: each line carries its event's ``position``, so a
rerun reads the last complete line and appends from the next position. A line cut
short by a crash is removed first. Nothing is kept elsewhere, so the bookmark cannot
disagree with what the file holds.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO

from task_queue import event_stream
from task_queue.stop_signals import Stop

EXPORT_BATCH = 1000
_CHUNK = 64 * 1024


@dataclass
class Exported:
    events: int = 0
    first: int | None = None
    last: int | None = None
    # Positions that were pruned (retention) before this export reached them.
    pruned: tuple[int, int] | None = None


def resume_position(path: Path) -> int:
    """The position of the last complete line in ``path`` (0 when there is none),
    after cutting off a trailing partial line."""
    if not path.exists():
        return 0
    with path.open("rb+") as f:
        end = f.seek(0, os.SEEK_END)
        f.seek(max(end - 1, 0))
        if end and f.read(1) != b"\n":
            end = _line_start(f, end)
            f.truncate(end)
        if not end:
            return 0
        start = _line_start(f, end - 1)
        f.seek(start)
        line = f.read(end - start)
    try:
        return int(json.loads(line)["position"])
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: the last line is not an exported event ({error})") from None


def _line_start(f: IO[bytes], end: int) -> int:
    """The offset just after the last newline before ``end`` (0 if there is none)."""
    position = end
    while position > 0:
        size = min(_CHUNK, position)
        position -= size
        f.seek(position)
        newline = f.read(size).rfind(b"\n")
        if newline >= 0:
            return position + newline + 1
    return 0


def export(
    out: IO[bytes],
    *,
    after: int,
    since_time: datetime | None,
    follow: bool,
    poll_seconds: float,
    stop: Stop,
    sync: bool = False,
) -> Exported:
    """Write events after position ``after`` to ``out``, one JSON object per line, in
    order. Each batch is flushed (and, with ``sync``, on disk) before the next is read.
    With ``follow``, wait for new events until ``stop`` is set."""
    done = Exported()
    while not stop.is_set():
        batch = event_stream.next_batch(after, limit=EXPORT_BATCH, since_time=since_time)
        if batch:
            if since_time is None and batch[0].position > after + 1:
                done.pruned = done.pruned or (after + 1, batch[0].position - 1)
            out.write(b"".join(event.to_json() + b"\n" for event in batch))
            out.flush()
            if sync:
                os.fsync(out.fileno())
            after = batch[-1].position
            done.events += len(batch)
            done.first = done.first or batch[0].position
            done.last = after
        if len(batch) < EXPORT_BATCH:
            if not follow:
                break
            stop.wait(poll_seconds)
    return done
