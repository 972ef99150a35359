"""The blob references in the agents' tables, for the queue's blob collector
(registered in ``AgentsConfig.ready``; each column has a partial index)."""

from __future__ import annotations

from task_queue.sql.db import fetch

REFERENCED_BY_AGENTS = """
SELECT result_ref FROM agent_events WHERE result_ref = ANY(%(refs)s::text[])
UNION SELECT payload_ref FROM agent_messages WHERE payload_ref = ANY(%(refs)s::text[])
UNION SELECT metadata_ref FROM agent_messages WHERE metadata_ref = ANY(%(refs)s::text[])
UNION SELECT payload_ref FROM agent_publications WHERE payload_ref = ANY(%(refs)s::text[])
UNION SELECT metadata_ref FROM agent_publications WHERE metadata_ref = ANY(%(refs)s::text[])
UNION SELECT result_ref FROM agent_publication_deliveries
      WHERE result_ref = ANY(%(refs)s::text[])
"""


def referenced_by_agents(refs: list[str]) -> set[str]:
    """Of ``refs``, those an agent event, a message, a publication or a delivery holds."""
    return {row[0] for row in fetch(REFERENCED_BY_AGENTS, {"refs": refs})}
