"""The event stream: the outbox of envelopes and the relays' cursors."""

from django.db import models
from django.db.models import Func
from django.db.models.functions import Now


class SessionRandomUUID(Func):
    """A random version 4 UUID from the session's pseudo-random generator
    (``random()``, seeded from the kernel at its first use in the session): 122
    random bits, for ids that must be unique, not unguessable. No connection of the
    product calls ``setseed()``, which would make them repeat.

    Why not ``gen_random_uuid()``: PostgreSQL built without OpenSSL, as the embedded
    server is, reads the kernel's random source for each one (open, read, close):
    2.6 us a UUID against 0.5 us for this, and 5 % of PostgreSQL's time in a drain,
    which writes two envelopes a task (docs/performance.md). PostgreSQL 17's
    ``random(min, max)`` was 0.08 us faster a UUID (3 M in 1.44-1.48 s against
    1.70-1.72 s, side by side on PostgreSQL 18), about 0.2 % of PostgreSQL's time a
    task; this works from PostgreSQL 15.

    Django does not see a change of ``template`` (it is not part of the field's
    deconstruction): a new SQL needs a migration that sets it, as queue 0030 does.
    """

    # 48 + 12 random bits around the version (4), then the variant (10, RFC 9562's)
    # and 52 + 10 random bits. random() gives 52 random bits (PostgreSQL 15 and
    # later); floor() keeps each part within its bits. A shift left does not check
    # for overflow: the 48 bits shifted by 16 fill the sign bit as they should.
    template = (
        "encode(int8send((floor(random() * 281474976710656)::bigint << 16)"
        " | x'4000'::bigint | floor(random() * 4096)::bigint)"
        " || int8send((floor(random() * 4503599627370496)::bigint << 10)"
        " | floor(random() * 1024)::bigint | x'8000000000000000'::bigint),"
        " 'hex')::uuid"
    )
    output_field = models.UUIDField()


class OutboxEvent(models.Model):
    """One envelope of the event stream (seed 000 §3), written by triggers in the same
    transaction as the change it records: a task's creation, claim and every history
    row, a direct message sent, acknowledged or expired, a publication.

    ``seq`` is taken at insert, so a transaction that commits late can hold a lower
    ``seq`` than one already read. Readers therefore go by ``position``, which one
    sequencer at a time gives to committed events in ``seq`` order
    (``task_queue.event_stream.sequence``): a reader resuming after a position never
    misses an event, and a task's events keep the order they happened in.
    """

    seq = models.BigAutoField(primary_key=True)
    position = models.BigIntegerField(null=True, blank=True)
    schema_version = models.TextField(db_default="v1")
    message_id = models.UUIDField(db_default=SessionRandomUUID())
    kind = models.TextField()  # evt.task.completed.v1, evt.message.sent.v1, …
    trace_id = models.TextField(null=True, blank=True)
    causation_id = models.TextField(null=True, blank=True)
    # What the event is about: a task, message or publication id.
    subject_id = models.TextField()
    emitted_at = models.DateTimeField(db_default=Now())
    payload = models.JSONField(default=dict)

    class Meta:
        db_table = "event_outbox"
        ordering = ["position"]
        constraints = [
            # Partial: a new event (no position yet) costs this index nothing.
            models.UniqueConstraint(
                fields=["position"],
                condition=models.Q(position__isnull=False),
                name="event_outbox_position_key",
            )
        ]
        indexes = [
            # The sequencer's work list: committed events without a position yet.
            models.Index(
                fields=["seq"],
                name="event_outbox_unpositioned_idx",
                condition=models.Q(position__isnull=True),
            ),
            models.Index(fields=["emitted_at"], name="event_outbox_emitted_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.position or '-'} {self.kind} {self.subject_id}"


class EventRelayCursor(models.Model):
    """How far ``relay_events`` has relayed the stream to one broker, with confirms."""

    destination = models.TextField(primary_key=True)  # the broker URL without credentials
    position = models.BigIntegerField(default=0)
    relayed = models.BigIntegerField(default=0)  # events confirmed, in all runs
    updated_at = models.DateTimeField(db_default=Now())
    # With --dispatch: every task due by then has had its command published.
    dispatched_through = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "event_relay_cursors"

    def __str__(self) -> str:
        return f"{self.destination} at {self.position}"
