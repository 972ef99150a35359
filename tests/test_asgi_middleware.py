"""Under daphne, Django runs every middleware on the event loop: none makes it run the
chain in a thread that calls back into the loop (automechanica/read_timeout.py says
how such a thread kept daphne from exiting on SIGTERM)."""

from __future__ import annotations

import logging

from django.core.handlers.asgi import ASGIHandler


def test_no_middleware_puts_the_chain_in_a_thread(settings, caplog):
    settings.DEBUG = True  # Django logs each mode it adapts only in debug
    with caplog.at_level(logging.DEBUG, logger="django.request"):
        ASGIHandler()  # loads MIDDLEWARE as daphne's process does
    adapted = [r.getMessage() for r in caplog.records if "handler adapted for" in r.getMessage()]
    assert adapted == []
