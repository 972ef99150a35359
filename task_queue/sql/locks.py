"""Cluster-wide advisory locks: every key in one place, so no two jobs share one.

The keys are four ASCII letters read as an integer, so a lock seen in ``pg_locks``
(``objid``) can be told apart. Transaction locks (``*_xact_*``) end with the
transaction; the relay's lock is a session lock, held while the relay runs.
"""

from __future__ import annotations

from task_queue.sql.db import fetch

# One process at a time: the lease reaper (workers and the maintenance loop).
REAPER = 0x72656170  # "reap"
# One process at a time: a retention pass.
RETENTION = 0x7072756E  # "prun"
# One process at a time: metric rollups (and recomputing them).
ROLLUP = 0x726F6C6C  # "roll"
# One sequencer at a time: each run commits its positions before the next begins,
# so a reader never sees position n+1 before n exists.
EVENT_SEQUENCER = 0x65767473  # "evts"
# One process per table at a time: recovery of expired leases (task_queue.leases) on
# agents_app's leased tables (the tasks' is the reaper's).
EMBEDDING_RECOVERY = 0x656D6264  # "embd"
MESSAGE_RECOVERY = 0x6D736773  # "msgs"
DELIVERY_RECOVERY = 0x646C7672  # "dlvr"
# One process at a time: syncing the schedules declared in settings
# (task_queue.schedules.firing), so two starting maintenance loops make each row once.
SCHEDULE_SYNC = 0x73636864  # "schd"
# One process at a time: syncing the alert rules declared in settings
# (task_queue.alerts.declared).
ALERT_RULE_SYNC = 0x616C7379  # "alsy"
# One process at a time: an evaluation of the alert rules (task_queue.alerts), so a
# rule's state changes, and its notification is made, once.
ALERTS = 0x616C7274  # "alrt"
# One process at a time: recovery of alert deliveries whose sender died mid-send.
ALERT_DELIVERY_RECOVERY = 0x616C6476  # "aldv"
# Per blob (task_queue.blobs, task_queue.blobs.collection): shared by every transaction
# about to reference the blob, taken exclusively by the collector before it checks
# the blob's references and deletes it. A key pair: this namespace and the first 32
# bits of the blob's SHA-256 (two blobs sharing the bits only share a lock).
BLOBS = 0x626C6F62  # "blob"
# Per agent with a limit (agent_limits): a claim holds its agents' locks from counting
# their slots until it commits, so two claims never both take the last slot. A key
# pair: this namespace and hashtext(agent name); taken inside the claim statement by
# the SQL function agent_claim_allowance (migration queue 0018), in name order, and
# by a change of the agent's limits (task_queue.limits).
AGENT_LIMITS = 0x6C696D74  # "limt"
_BLOB_KEY = f"{BLOBS}, ('x' || substr(ref, 8, 8))::bit(32)::int"

AGENT_LIMITS_LOCK = f"SELECT pg_advisory_xact_lock({AGENT_LIMITS}, hashtext(%(agent)s))"


def agent_limits_lock(agent: str) -> None:
    """Take the agent's limits lock (the one claims take) until the current
    transaction ends, waiting for it: a change of limits waits for claims in flight."""
    fetch(AGENT_LIMITS_LOCK, {"agent": agent})


TRY_ADVISORY_XACT_LOCK = "SELECT pg_try_advisory_xact_lock(%(key)s)"


def try_advisory_xact_lock(key: int) -> bool:
    """Take a cluster-wide lock until the current transaction ends, if it is free."""
    return fetch(TRY_ADVISORY_XACT_LOCK, {"key": key})[0][0]


ADVISORY_XACT_LOCK = "SELECT pg_advisory_xact_lock(%(key)s)"


def advisory_xact_lock(key: int) -> None:
    """Take a cluster-wide lock until the current transaction ends, waiting for it."""
    fetch(ADVISORY_XACT_LOCK, {"key": key})


SHARE_BLOB_LOCKS = f"""
SELECT count(pg_advisory_xact_lock_shared({_BLOB_KEY})) FROM unnest(%(refs)s::text[]) AS ref
"""


def share_blob_locks(refs: list[str]) -> None:
    """Hold the blobs' locks, shared, until the current transaction ends (waiting for a
    collector that holds one)."""
    fetch(SHARE_BLOB_LOCKS, {"refs": refs})


TRY_BLOB_LOCKS = f"""
SELECT ref FROM unnest(%(refs)s::text[]) AS ref WHERE pg_try_advisory_xact_lock({_BLOB_KEY})
"""


def try_blob_locks(refs: list[str]) -> list[str]:
    """Take the blobs' locks exclusively until the current transaction ends, where no
    one holds them; the refs whose lock was taken."""
    return [row[0] for row in fetch(TRY_BLOB_LOCKS, {"refs": refs})]


# A session lock per name (one relay per destination), keyed by the name's hash.
TRY_NAMED_LOCK = "SELECT pg_try_advisory_lock(hashtextextended(%(name)s, 0))"
NAMED_UNLOCK = "SELECT pg_advisory_unlock(hashtextextended(%(name)s, 0))"


def try_named_lock(name: str) -> bool:
    """Take the session lock ``name`` if it is free; held until ``named_unlock``."""
    return fetch(TRY_NAMED_LOCK, {"name": name})[0][0]


def named_unlock(name: str) -> None:
    fetch(NAMED_UNLOCK, {"name": name})
