"""The pages' charts: stacked or grouped bars as inline SVG (pages and the
printable version), drawn here without a charting library, and the series
they show. The emailed chart (a PNG: mail clients drop SVG) is drawn by
matplotlib in ``mailchart``."""

from html import escape

from django.utils.safestring import SafeString, mark_safe

PALETTE = ["#4f46e5", "#06b6d4", "#f59e0b", "#ef4444", "#10b981", "#8b5cf6"]


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1
    magnitude = 10 ** (len(str(int(value))) - 1)
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * magnitude:
            return step * magnitude
    return 10 * magnitude


def _short(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.3g}" if n != int(n) else str(int(n))


def bar_chart(labels: list[str], series: list[tuple[str, list[float]]], *, width: int = 560, height: int = 200,
              title: str = "", stacked: bool = True) -> SafeString:
    """Bars per label, stacked or side by side; ``series`` = [(name, values)]. Every text is escaped."""
    left, right, top, bottom = 48, 8, 10, 34
    plot_w, plot_h = width - left - right, height - top - bottom
    n = max(1, len(labels))
    if stacked:
        totals = [sum(s[1][i] for s in series) for i in range(len(labels))]
    else:
        totals = [v for s in series for v in s[1]]
    ymax = _nice_max(max(totals, default=0))
    slot = plot_w / n
    bar = max(1.0, slot * 0.72)
    each = bar if stacked else max(1.0, bar / max(1, len(series)))
    parts = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
             f'width="100%" role="img" aria-label="{escape(title)}" preserveAspectRatio="xMidYMid meet">']
    if title:
        parts.append(f"<title>{escape(title)}</title>")
    for frac in (0, 0.5, 1):
        y = top + plot_h * (1 - frac)
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e2e8f0"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11" fill="#64748b">'
                     f"{_short(ymax * frac)}</text>")
    every = max(1, round(n / 8))
    for i, label in enumerate(labels):
        x = left + slot * i + (slot - bar) / 2
        y = top + plot_h
        tips = [f"{escape(label)}"]
        for k, (name, values) in enumerate(series):
            h = plot_h * values[i] / ymax
            if stacked:
                y -= h
                bx = x
            else:
                y = top + plot_h - h
                bx = x + each * k
            if h > 0:
                parts.append(f'<rect x="{bx:.1f}" y="{y:.1f}" width="{each:.1f}" height="{h:.1f}" '
                             f'fill="{PALETTE[k % len(PALETTE)]}"/>')
            tips.append(f"{escape(name)}: {values[i]:,.0f}")
        parts.append(f'<rect x="{left + slot * i:.1f}" y="{top}" width="{slot:.1f}" height="{plot_h}" '
                     f'fill="transparent"><title>{" · ".join(tips)}</title></rect>')
        if i % every == 0:
            parts.append(f'<text x="{left + slot * i + slot / 2:.1f}" y="{height - bottom + 16}" text-anchor="middle" '
                         f'font-size="11" fill="#64748b">{escape(label)}</text>')
    lx = left
    for k, (name, _) in enumerate(series):
        parts.append(f'<rect x="{lx}" y="{height - 11}" width="10" height="10" fill="{PALETTE[k % len(PALETTE)]}"/>'
                     f'<text x="{lx + 14}" y="{height - 2}" font-size="11" fill="#334155">{escape(name)}</text>')
        lx += 24 + 7 * len(name)
    parts.append("</svg>")
    return mark_safe("".join(parts))


def daily_series(result: dict) -> tuple[list[str], list[tuple[str, list[float]]]]:
    days = result.get("daily", [])
    labels = [d["date"][5:] for d in days]
    return labels, [("messages in", [d["msgs_in"] for d in days]), ("messages out", [d["msgs_out"] for d in days])]


def churn_series(result: dict) -> tuple[list[str], list[tuple[str, list[float]]]]:
    days = result.get("daily", [])
    labels = [d["date"][5:] for d in days]
    return labels, [("connects", [d["connects"] for d in days]), ("disconnects", [d["disconnects"] for d in days])]
