"""Saving a row whose name is unique, when another transaction may take the name
between the caller's check and the save (schedules, alert rules)."""

from __future__ import annotations

from collections.abc import Callable

from django.db import IntegrityError, transaction
from django.db.models import Model


def save_named(row: Model, constraint: str, taken: Callable[[], Exception]) -> None:
    """Save ``row``; if the unique ``constraint`` on its name refuses it, raise
    ``taken()`` (the caller's "that name exists", not a database error). Any other
    integrity error is raised as it is."""
    try:
        with transaction.atomic():
            row.save()
    except IntegrityError as error:
        diag = getattr(error.__cause__, "diag", None)
        if diag is None or diag.constraint_name != constraint:
            raise
        raise taken() from None
