"""The API's answers are written by pydantic's serializer (FastJsonRenderer): times to
the microsecond in UTC, ids as text; what it cannot write falls back to ninja's
encoder rather than failing the request."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from uuid import UUID

from automechanica.api.main import FastJsonRenderer

RENDER = FastJsonRenderer()


def render(data: object) -> object:
    return json.loads(RENDER.render(None, data, response_status=200))


def test_times_ids_and_text_as_the_api_writes_them():
    moment = datetime(2026, 11, 29, 12, 50, 52, 944762, tzinfo=UTC)
    assert render(
        {
            "at": moment,
            "whole": moment.replace(microsecond=0),
            "elsewhere": moment.astimezone(timezone(timedelta(hours=2))),
            "id": UUID(int=5),
            "text": "é ✓",
        }
    ) == {
        "at": "2026-11-29T12:50:52.944762Z",
        "whole": "2026-11-29T12:50:52Z",
        "elsewhere": "2026-11-29T14:50:52.944762+02:00",
        "id": "00000000-0000-0000-0000-000000000005",
        "text": "é ✓",
    }


def test_what_pydantic_cannot_write_falls_back_to_ninjas_encoder():
    # A lone surrogate (JSON's "\ud800" read by Python) is not UTF-8: escaped instead.
    assert render({"text": "a\ud800b", "id": UUID(int=1)}) == {
        "text": "a\ud800b",
        "id": "00000000-0000-0000-0000-000000000001",
    }
