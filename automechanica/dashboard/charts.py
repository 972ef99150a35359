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
    """One bar per minute (the overview's last hour)."""
    labelled = [(minute.strftime("%H:%M"), n) for minute, n in minutes]
    return bars(labelled, title=title, css_class=css_class, span="per minute, last hour")


def bars(
    labelled: Sequence[tuple[str, int]], *, title: str, css_class: str, span: str
) -> SafeString:
    """One bar per (label, count), scaled to the largest, each with a tooltip."""
    peak = max((n for _, n in labelled), default=0) or 1
    slot = WIDTH / max(len(labelled), 1)
    rects = format_html_join(
        "",
        '<rect x="{}" y="{}" width="{}" height="{}"><title>{} {}: {}</title></rect>',
        (
            (
                # format_html escapes its arguments into strings: numbers go in formatted.
                f"{i * slot:.1f}",
                f"{HEIGHT - n / peak * HEIGHT:.1f}",
                f"{max(slot - GAP, 1):.1f}",
                f"{n / peak * HEIGHT:.1f}",
                label,
                title,
                n,
            )
            for i, (label, n) in enumerate(labelled)
        ),
    )
    return format_html(
        '<svg class="chart {}" viewBox="0 0 {} {}" preserveAspectRatio="none" role="img" '
        'aria-label="{} {}, peak {}">{}</svg>',
        css_class,
        WIDTH,
        HEIGHT,
        title,
        span,
        peak,
        rects,
    )
