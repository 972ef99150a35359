"""Enable pgvector before any table needs it (agent memory stores embeddings).

``task_queue.signals.require_a_capable_server`` checks before ``migrate`` applies anything
that the server has the extension, and stops with a one-line reason if not.
"""

from django.db import migrations


class Migration(migrations.Migration):
    initial = True
    dependencies: list = []
    operations = [
        migrations.RunSQL("CREATE EXTENSION IF NOT EXISTS vector", migrations.RunSQL.noop)
    ]
