"""The payload search (the API's ``q``) is served by the trigram index where the
server has pg_trgm (migration queue 0010)."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from automechanica.api.listing import filter_tasks
from automechanica.api.schemas import TaskFilters
from task_queue import operations
from task_queue.models import Task
from tests.support.database import count_rows

pytestmark = pytest.mark.django_db


def test_the_q_search_uses_the_trigram_index():
    if not count_rows("SELECT count(*) FROM pg_extension WHERE extname = 'pg_trgm'"):
        pytest.skip("this server has no pg_trgm: the search is a scan bounded by the read timeout")
    for n in range(20):
        operations.enqueue("EchoAgent", "echo", {"sku": f"SKU-{n}"})
    search = filter_tasks(Task.objects.all(), TaskFilters(q="sku-17")).values("id")
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = off")
        plan = search.explain()
        assert len(search) == 1
    assert "tasks_payload_trgm_idx" in plan, plan
