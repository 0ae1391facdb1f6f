"""Plots and tables for lesson 00 (this machine), and the small table printer every lesson uses.

Helpers take the plain data an experiment returned and draw it; they compute nothing that a
check cell would need (the numbers all come from the experiment's result).
"""
from __future__ import annotations

import numpy as np

from .. import costmodel


def table(headers: list[str], rows: list[list], title: str | None = None) -> str:
    """An aligned text table (pandas is not a dependency of the course); returns and prints it."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [title] if title else []
    lines.append("  ".join(h.rjust(w) for h, w in zip(cells[0], widths)))
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells[1:]]
    text = "\n".join(lines)
    print(text)
    return text


def legend_beside(ax, **options) -> None:
    """The legend to the right of the axes, never over the data (the saved image grows to hold it)."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize="small", **options)


def legend_below(ax, ncol: int = 2) -> None:
    """The legend under the axes (for side-by-side plots, where the right of one is the next one)."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=ncol, fontsize="small", frameon=False)


def show(fig) -> None:
    """Display a figure in the current cell or panel output, then free it (no duplicate at cell end)."""
    import matplotlib.pyplot as plt
    from IPython.display import display
    display(fig)
    plt.close(fig)


def human_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}" if n % size == 0 else f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


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


ALGO_STYLE = {"builtin": ("#4C72B0", "o"), "ring": ("#DD8452", "s"), "tree": ("#55A868", "^"),
              "naive": ("#C44E52", "D")}


def plot_profile(result: dict):
    """Left: measured all-reduce time per size (points) and the ring's alpha-beta fit (line).
    Right: bus bandwidth per size, the number nccl-tests reports."""
    import matplotlib.pyplot as plt
    sizes, world = result["sizes"], result["world_size"]
    fit = result["fit"]
    params = costmodel.LinkParams(fit["alpha_s"], fit["beta_s_per_byte"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    algorithms = sorted({r["algorithm"] for r in result["rows"]}, key=list(ALGO_STYLE).index)
    for algorithm in algorithms:
        color, marker = ALGO_STYLE.get(algorithm, ("#777777", "o"))
        rows = sorted((r for r in result["rows"] if r["algorithm"] == algorithm), key=lambda r: r["bytes"])
        left.plot([r["bytes"] for r in rows], [r["time_s"] * 1e3 for r in rows], marker, color=color,
                  label=f"{algorithm} (measured)")
        right.plot([r["bytes"] for r in rows], [r["busbw_GBps"] for r in rows], marker + "-", color=color,
                   label=algorithm)
    dense = np.geomspace(sizes[0], sizes[-1], 100)
    left.plot(dense, [costmodel.predict("ring", float(round(n)), world, params) * 1e3 for n in dense], "-",
              color=ALGO_STYLE["ring"][0],
              label=f"ring fit: alpha={fit['alpha_s'] * 1e6:.0f} us, {fit['bandwidth_GBps']:.2f} GB/s")
    log_axis(left)
    left.set_ylabel("all-reduce time (ms, log scale)")
    left.set_title(f"All-reduce time, {world} ranks ({result['backend']})")
    right.set_ylabel("bus bandwidth (GB/s)")
    right.set_title("Bus bandwidth = size / time x 2(W-1)/W")
    for ax in (left, right):
        size_axis(ax, sizes)
        ax.set_xlabel("message size per rank")
        ax.grid(alpha=0.3)
        legend_below(ax, ncol=2)
    fig.tight_layout()
    return fig


def render_profile(result: dict) -> None:
    """What the panel shows after a run: the machine, the sweep as a table, then the plot."""
    m = result["machine"]
    gpus = ", ".join(m["gpus"]) if m["gpus"] else "none"
    print(f"python {m['python']}, torch {m['torch']}, CUDA {m['cuda'] or 'none'}")
    print(f"CPU cores: {m['cpus']}   GPUs: {gpus}   gloo: {m['gloo']}   nccl: {m['nccl']}")
    print(f"{result['world_size']} ranks use backend {result['backend']} on {result['device']}\n")
    rows = sorted(result["rows"], key=lambda r: (r["bytes"], r["algorithm"]))
    table(["size", "algorithm", "time (ms)", "algbw (GB/s)", "busbw (GB/s)"],
          [[human_bytes(r["bytes"]), r["algorithm"], f"{r['time_s'] * 1e3:.3f}", f"{r['algbw_GBps']:.3f}",
            f"{r['busbw_GBps']:.3f}"] for r in rows])
    fit = result["fit"]
    print(f"\nring fit: alpha = {fit['alpha_s'] * 1e6:.1f} us per message, beta = {fit['beta_s_per_byte'] * 1e9:.3f} "
          f"ns/byte ({fit['bandwidth_GBps']:.2f} GB/s), R^2 = {fit['r2']:.3f}")
    show(plot_profile(result))
