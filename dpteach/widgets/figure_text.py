"""What a figure shows, in words, read from the figure itself: its alt text on the site and in the stored notebook.

A screen reader, a text-only viewer and a search engine all see a figure as its text. Every figure of the course
is drawn from one run's numbers, so its description is written from the drawn figure too, not typed by hand:
for each panel of the figure its title, what is plotted against what (the axis labels), and for each labelled
series where it starts and ends, its lowest and highest point; for bars, each bar's value. ``rendering.show``
stores the description with the image (as its ``text/plain`` and as ``alt`` in the output's metadata), and the
static site makes it the image's ``alt`` attribute (``site/build.py``). WCAG 2.1's success criterion 1.1.1
asks for a text alternative that serves the same purpose; the numbers a figure is drawn to compare are that
purpose here.
"""
from __future__ import annotations

import math

MAX_SERIES = 8     # series (or bars) described per panel; the rest are counted
MAX_CHARS = 1200   # a description longer than this is cut at a sentence


def _number(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if abs(value) >= 1e6 or (value != 0 and abs(value) < 1e-2):
        return f"{value:.3g}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _finite(pairs):
    return [(x, y) for x, y in pairs if math.isfinite(x) and math.isfinite(y)]


def _line(line) -> str | None:
    """``bf16: from 0.0005 at step 1 to -0.0003 at step 6 (lowest -0.0006 at 4, highest 0.0005 at 1)``."""
    label = line.get_label()
    if not label or label.startswith("_"):
        return None
    try:
        pairs = _finite(zip(map(float, line.get_xdata()), map(float, line.get_ydata())))
    except (TypeError, ValueError):  # categorical or date axes: the label alone
        return label
    if not pairs:
        return None
    (x0, y0), (x1, y1) = pairs[0], pairs[-1]
    if len(pairs) == 1:
        return f"{label}: {_number(y0)} at {_number(x0)}"
    if all(y == y0 for _, y in pairs):
        return f"{label}: {_number(y0)} throughout"
    low = min(pairs, key=lambda p: p[1])
    high = max(pairs, key=lambda p: p[1])
    return (f"{label}: from {_number(y0)} at {_number(x0)} to {_number(y1)} at {_number(x1)} "
            f"(lowest {_number(low[1])} at {_number(low[0])}, highest {_number(high[1])} at {_number(high[0])})")


def _nearest_label(ticks: list[tuple[float, str]], at: float) -> str:
    """The tick label nearest ``at`` (grouped bars sit beside their group's tick), or the position itself."""
    if not ticks:
        return _number(at)
    position, label = min(ticks, key=lambda t: abs(t[0] - at))
    spacing = min((abs(a[0] - b[0]) for a, b in zip(ticks, ticks[1:])), default=float("inf"))
    return label if abs(position - at) <= spacing / 2 else _number(at)


def _bars(ax) -> list[str]:
    """Each bar's value (its height, or its width for horizontal bars), named by the nearest tick label of the
    category axis and by its series' label."""
    from matplotlib.container import BarContainer
    said = []
    for container in ax.containers:
        if not isinstance(container, BarContainer):
            continue
        horizontal = getattr(container, "orientation", "vertical") == "horizontal"
        axis_ticks, axis_labels = (ax.get_yticks(), ax.get_yticklabels()) if horizontal else \
            (ax.get_xticks(), ax.get_xticklabels())
        ticks = [(float(t), label.get_text()) for t, label in zip(axis_ticks, axis_labels) if label.get_text()]
        series = container.get_label()
        series = "" if not series or series.startswith("_") else f"{series}, "
        for bar in container.patches:
            centre = bar.get_y() + bar.get_height() / 2 if horizontal else bar.get_x() + bar.get_width() / 2
            value = bar.get_width() if horizontal else bar.get_height()
            said.append(f"{series}{_nearest_label(ticks, centre)}: {_number(value)}")
    return said


def _panel(ax) -> str:
    title, xlabel, ylabel = ax.get_title(), ax.get_xlabel(), ax.get_ylabel()
    head = f"{title}: " if title else ""
    parts = [p for p in (_line(line) for line in ax.get_lines()) if p]
    what = f"{ylabel or 'values'} against {xlabel}" if xlabel else f"{ylabel or 'values'}"
    kind = "lines" if parts else ""
    bars = _bars(ax)
    if bars:
        kind = "bars" if not parts else "lines and bars"
        parts += bars
    if not parts:
        parts = [c.get_label() for c in ax.collections if c.get_label() and not c.get_label().startswith("_")]
        rows = [label.get_text() for label in ax.get_yticklabels() if label.get_text()]
        if ax.collections and rows:  # a timeline: spans on named rows (the Gantt charts of the lessons)
            low, high = ax.get_xlim()
            kind = f"spans on the rows {', '.join(rows[:MAX_SERIES])}{' and more' if len(rows) > MAX_SERIES else ''}"
            what = f"{xlabel or 'position'}, from {_number(low)} to {_number(high)}"
        else:
            kind = "points or areas" if parts else "an image or shapes"
    shown = parts[:MAX_SERIES] + ([f"and {len(parts) - MAX_SERIES} more"] if len(parts) > MAX_SERIES else [])
    return f"{head}{kind} {'over' if kind.startswith('spans') else 'of'} {what}" + \
        (f" - {'; '.join(shown)}" if shown else "") + "."


def describe(fig) -> str:
    """The figure's description: one sentence per panel (axes with something drawn), in reading order."""
    axes = [ax for ax in fig.get_axes() if ax.get_visible() and (ax.has_data() or ax.get_title())]
    axes.sort(key=lambda ax: (-round(ax.get_position().y1, 2), ax.get_position().x0))
    title = fig._suptitle.get_text() + ". " if getattr(fig, "_suptitle", None) else ""
    count = f"Figure with {len(axes)} panels. " if len(axes) > 1 else "Figure. "
    text = title + count + " ".join(_panel(ax) for ax in axes)
    if len(text) > MAX_CHARS:
        text = text[:MAX_CHARS].rsplit("; ", 1)[0] + " (cut)."
    return text
