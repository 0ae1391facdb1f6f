"""What every lesson's render helpers share: tables, figures shown once, legends clear of the data, axes
of message sizes. One module, so that all tables and figures in the course look alike.

Helpers take plain data and draw it; they compute nothing a check cell would need.
"""
from __future__ import annotations

from html import escape

from ..front_end import in_kernel
from ..units import human_bytes  # noqa: F401 (the lessons and widgets import it from here too)

from IPython.display import HTML


def table(headers: list[str], rows: list[list], title: str | None = None) -> str:
    """A table (pandas is not a dependency of the course): in a notebook an HTML table, whose columns wrap
    their headers instead of breaking every line in a narrow window; elsewhere aligned text. Returns the text."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [title] if title else []
    lines.append("  ".join(h.rjust(w) for h, w in zip(cells[0], widths)))
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells[1:]]
    text = "\n".join(lines)
    if in_kernel():
        from IPython.display import display
        if title:
            print(title)
        shown = html_table(list(headers), [[str(c) for c in row] for row in rows],
                           align="".join("l" if not _numeric(c) else "r" for c in (rows[0] if rows else headers)))
        # the aligned text too, for a front end or a stored copy that shows no HTML (front_end.py)
        display({"text/html": shown.data, "text/plain": "\n".join(lines[1:] if title else lines)}, raw=True)
    else:
        print(text)
    return text


def _numeric(value) -> bool:
    return isinstance(value, (int, float)) or str(value).replace(",", "").replace(".", "", 1).lstrip("-").isdigit()


def html_table(header: list[str], rows: list[list], align: str | None = None) -> HTML:
    """A small HTML table; ``align`` is one letter per column, 'l' or 'r' (default: text left, numbers right)."""
    def cell(tag, value, a):
        return f'<{tag} style="text-align:{"left" if a == "l" else "right"};padding:2px 10px">{value}</{tag}>'
    if align is None:
        align = "".join("r" if isinstance(v, (int, float)) else "l" for v in rows[0]) if rows else "l" * len(header)
    head = "".join(cell("th", escape(str(h)), a) for h, a in zip(header, align))
    body = "".join("<tr>" + "".join(cell("td", v if isinstance(v, str) else escape(str(v)), a)
                                    for v, a in zip(row, align)) + "</tr>" for row in rows)
    return HTML(f'<table style="border-collapse:collapse;font-size:90%"><tr>{head}</tr>{body}</table>')


def show(fig, description: str | None = None) -> None:
    """Display a figure in the current cell or panel output, then free it (no duplicate at cell end).

    The figure travels with its description (``figure_text.describe``, or ``description``): as its ``text/plain``,
    which a front end that shows no images prints, and as ``alt`` in the output's metadata, which the static site
    makes the image's alt text."""
    import matplotlib.pyplot as plt
    from IPython import get_ipython
    from IPython.display import display

    from .figure_text import describe
    shell = get_ipython()
    if shell is None:  # a script or a terminal: nothing shows images
        display(fig)
    else:
        said = description or describe(fig)
        data, metadata = shell.display_formatter.format(fig)
        data["text/plain"] = said
        for mime in ("image/png", "image/svg+xml", "image/jpeg"):
            if mime in data:
                metadata = {**metadata, mime: {**metadata.get(mime, {}), "alt": said}}
        display(data, metadata=metadata, raw=True)
    plt.close(fig)


def legend_beside(ax, **options) -> None:
    """The legend to the right of the axes, never over the data (the saved image grows to hold it)."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize="small", **options)


def legend_below(ax, ncol: int = 2) -> None:
    """The legend under the axes (for side-by-side plots, where the right of one is the next one)."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=ncol, fontsize="small", frameon=False)


def dress(ax, xlabel: str | None = None, ylabel: str | None = None, title: str | None = None, *,
          grid: str | None = "both", legend: str | None = None, ncol: int = 2, title_size=None) -> None:
    """Label one axes the course's way: its labels and title, a light grid along ``grid`` ("x", "y", "both", or
    None), and its legend ``"beside"`` or ``"below"`` the axes (None: no legend)."""
    if xlabel is not None:
        ax.set_xlabel(xlabel)
    if ylabel is not None:
        ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title, **({"fontsize": title_size} if title_size else {}))
    if grid:
        ax.grid(axis=grid, alpha=0.3)
    if legend == "beside":
        legend_beside(ax)
    elif legend == "below":
        legend_below(ax, ncol=ncol)
    elif legend is not None:
        raise ValueError(f"legend={legend!r}: give 'beside', 'below' or None")


def size_axis(ax, sizes) -> None:
    """Log-scaled x axis of message sizes, ticked at the measured sizes with readable labels."""
    ax.set_xscale("log")
    ax.set_xticks(sizes, [human_bytes(s) for s in sizes])
    ax.minorticks_off()


def log_axis(ax, axis: str = "y", bytes_: bool = False) -> None:
    """Log scale with plain tick labels (1, 2, 5, 10, ... or 4 KiB, 1 MiB, ...) instead of 10^x."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    target = ax.yaxis if axis == "y" else ax.xaxis
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    if bytes_:
        target.set_major_locator(LogLocator(base=4))
        target.set_major_formatter(FuncFormatter(lambda v, _: human_bytes(v)))
    else:
        target.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    target.set_minor_formatter(NullFormatter())
