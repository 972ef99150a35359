"""Debian's Chromium for the browser tests, and where their screenshots go."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
SCREENSHOTS = Path(__file__).resolve().parent.parent.parent / "var" / "screenshots"

needs_chromium = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM}")

# The status of a POST from the page, with its CSRF token (as a form would send it).
POST_STATUS = """async (url) => (await fetch(url, {method: "POST", headers: {"X-CSRFToken":
                    document.cookie.match(/csrftoken=([^;]+)/)[1]}})).status"""
