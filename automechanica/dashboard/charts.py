"""Server-rendered SVG charts: no chart library, no JavaScript, swapped in live."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

WIDTH, HEIGHT, GAP = 600, 120, 1


def per_minute_bars(
    minutes: Sequence[tuple[datetime, int]], *, title: str, css_class: str
) -> SafeString:
    """One bar per minute, scaled to the busiest minute, each with a tooltip."""
    peak = max((n for _, n in minutes), default=0) or 1
    slot = WIDTH / max(len(minutes), 1)
    bars = format_html_join(
        "",
        '<rect x="{}" y="{}" width="{}" height="{}"><title>{} {}: {}</title></rect>',
        (
            (
                # format_html escapes its arguments into strings: numbers go in formatted.
                f"{i * slot:.1f}",
                f"{HEIGHT - n / peak * HEIGHT:.1f}",
                f"{max(slot - GAP, 1):.1f}",
                f"{n / peak * HEIGHT:.1f}",
                minute.strftime("%H:%M"),
                title,
                n,
            )
            for i, (minute, n) in enumerate(minutes)
        ),
    )
    return format_html(
        '<svg class="chart {}" viewBox="0 0 {} {}" preserveAspectRatio="none" role="img" '
        'aria-label="{} per minute, last hour, peak {}">{}</svg>',
        css_class,
        WIDTH,
        HEIGHT,
        title,
        peak,
        bars,
    )
