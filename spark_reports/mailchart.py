"""The emailed report's chart: messages per day as a PNG drawn by matplotlib
(mail clients drop SVG, so the pages' hand-made SVG charts cannot go).

A chart a reader can take in without the console: a title with the period,
the days on the x axis ("Day (UTC)"), messages on the y axis with thousands
separators, a legend for in and out. Drawn with the Agg backend through
``Figure`` (not ``pyplot``: no global state, safe in the worker's threads).
"""

import io

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from .charts import PALETTE

WIDTH_IN, HEIGHT_IN, DPI = 5.92, 2.6, 200    # shown 592 px wide in the email: sharp on high-density screens
X_LABEL = "Day (UTC)"
Y_LABEL = "Messages"


def _thousands(value: float, _pos=None) -> str:
    return f"{value:,.0f}"


def daily_figure(labels: list[str], series: list[tuple[str, list[float]]], title: str) -> Figure:
    """Stacked bars per day, one colour per series (``[(name, values)]``), axes labelled."""
    fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    positions = range(len(labels))
    bottom = [0.0] * len(labels)
    for k, (name, values) in enumerate(series):
        ax.bar(positions, values, bottom=bottom, width=0.72, label=name, color=PALETTE[k % len(PALETTE)])
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    fig.suptitle(title, fontsize=11, x=0.01, ha="left")
    ax.set_xlabel(X_LABEL, fontsize=9)
    ax.set_ylabel(Y_LABEL, fontsize=9)
    every = max(1, round(len(labels) / 10))
    ax.set_xticks(list(positions)[::every], labels[::every], fontsize=8)
    ax.yaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
    ax.yaxis.set_major_formatter(FuncFormatter(_thousands))
    ax.tick_params(axis="y", labelsize=8)
    ax.set_ylim(bottom=0)
    ax.grid(axis="y", color="#e2e8f0", linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    # between the title and the bars: the plot keeps the whole width (the email may be a phone wide)
    ax.legend(fontsize=8, frameon=False, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=len(series),
              borderaxespad=0.2, handlelength=1.2)
    return fig


def daily_png(labels: list[str], series: list[tuple[str, list[float]]], title: str) -> bytes:
    """``daily_figure`` as PNG bytes (the title also in the PNG's metadata)."""
    buf = io.BytesIO()
    daily_figure(labels, series, title).savefig(buf, format="png", metadata={"Title": title})
    return buf.getvalue()
