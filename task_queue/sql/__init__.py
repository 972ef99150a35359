"""The queue's raw SQL: named, parameterised statements, one module per concern.

Nothing else opens a cursor on the queue's tables. Each module holds its statements
as constants and a small function per statement that runs it (``db.fetch`` or
``db.execute`` on Django's connection for the calling thread, so it joins the
caller's transaction). Statements that depend on the clock take ``now`` (``db.NOW``):
``None`` is the database's clock, and tests pass a time to step through leases and
backoff without sleeping. Leases are fenced as ``task_queue.leases`` describes.

Apps above the queue keep their own SQL (``agents_app.sql``); where a queue statement
must write their tables in the same statement, they add the part themselves
(``outcomes.add_to_completion``).
"""
