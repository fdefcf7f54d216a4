"""Small inline SVG charts: no chart library, nothing fetched by the browser."""

from __future__ import annotations

from markupsafe import Markup, escape


def bar_chart(values: list[int], *, width: int = 240, height: int = 48, label: str = "", unit: str = "events") -> Markup:
    """Bars for a series (oldest first), scaled to its maximum, with the total and peak in the title."""
    count = max(1, len(values))
    peak = max(values, default=0)
    step = width / count
    bars = []
    for index, value in enumerate(values):
        if not value:
            continue
        h = max(1.0, (value / peak) * (height - 2))
        bars.append(
            f'<rect class="{unit}" x="{index * step:.1f}" y="{height - h:.1f}" width="{max(step - 1, 1):.1f}" height="{h:.1f}">'
            f"<title>{value}</title></rect>"
        )
    if unit == "events":
        title = escape(f"{label}: {sum(values)} events in the last {len(values)} min, peak {peak}/min")
    else:
        title = escape(f"{label}: mean {unit} per minute over the last {len(values)} min, peak {peak} {unit}")
    if unit == "events":
        caption = f"{sum(values)} events/h · peak {peak}/min"
    else:
        caption = f"mean time to finish per minute · peak {peak} ms"
    return Markup(
        f'<figure class="chart"><svg class="chart" role="img" aria-label="{title}" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" preserveAspectRatio="none"><title>{title}</title>'
        f'<line x1="0" y1="{height - 0.5}" x2="{width}" y2="{height - 0.5}" class="axis"/>{"".join(bars)}</svg>'
        f"<figcaption>{escape(caption)}</figcaption></figure>"
    )
