"""The blob references in the queue's tables (the blob collector's check).

Each ``*_ref`` column has a partial index over its non-null rows, so a check probes
the few rows that hold a blob.
"""

from __future__ import annotations

from task_queue.sql.db import fetch

REFERENCED_BY_QUEUE = """
SELECT payload_ref FROM tasks WHERE payload_ref = ANY(%(refs)s::text[])
UNION SELECT result_ref FROM tasks WHERE result_ref = ANY(%(refs)s::text[])
UNION SELECT metadata_ref FROM workflows WHERE metadata_ref = ANY(%(refs)s::text[])
"""


def referenced_by_queue(refs: list[str]) -> set[str]:
    """Of ``refs``, those a task (payload, result) or a workflow (metadata) holds."""
    return {row[0] for row in fetch(REFERENCED_BY_QUEUE, {"refs": refs})}
