"""Plots and tables for ``notebooks/08_input_pipeline.ipynb`` (data from ``dpteach.experiments.input_pipeline``)."""
from __future__ import annotations

import matplotlib.pyplot as plt
from IPython.display import display

from .gantt import plot_gantt
from .rendering import html_table, legend_below, legend_beside, show


def plot_step_breakdown(result: dict):
    """Median step per configuration: time blocked waiting for data, then compute."""
    rows = result["rows"]
    names = [r["name"] for r in rows]
    wait = [r["median_wait_s"] * 1e3 for r in rows]
    compute = [r["median_compute_s"] * 1e3 for r in rows]
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(rows) + 1.8))
    spreads = [r["wait_spread"] for r in rows]
    ax.barh(names, wait, color="#937860", label="waiting for the next batch (bar: interval of the steady steps)",
            xerr=[[max(0.0, w - s["low"] * 1e3) for w, s in zip(wait, spreads)],
                  [max(0.0, s["high"] * 1e3 - w) for w, s in zip(wait, spreads)]], capsize=3)
    ax.barh(names, compute, left=wait, color="#55A868", label="forward + backward (DDP) + optimizer")
    for i, row in enumerate(rows):
        share = wait[i] / (wait[i] + compute[i]) if wait[i] + compute[i] else 0.0  # what the bar shows
        ax.text(wait[i] + compute[i], i, f"  waiting {share:.0%}", va="center", fontsize=9)
    ax.invert_yaxis()
    ax.set_xlim(0, max(max(w + c for w, c in zip(wait, compute)), max(s["high"] * 1e3 for s in spreads)) * 1.25)
    ax.set_xlabel("median time per step, excluding each epoch's first batch (ms); label: the median wait's share")
    ax.set_title(f"Decoding costs {result['decode_ms']:g} ms per sample, {result['batch_per_rank']} samples per "
                 f"batch; W={result['world_size']} ({result['backend']}, {result['device']})", fontsize=10)
    legend_below(ax, ncol=2)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_waits_per_step(result: dict):
    """Rank 0's wait for every step: the first batch of each epoch pays for starting the workers."""
    fig, ax = plt.subplots(figsize=(9, 4))
    for row in result["rows"]:
        ax.plot(range(len(row["waits_rank0"])), [w * 1e3 for w in row["waits_rank0"]], marker="o", markersize=3,
                label=row["name"])
    for epoch in range(1, result["epochs"]):
        ax.axvline(epoch * result["steps_per_epoch"] - 0.5, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("step (dotted line: a new epoch, new loader iterator)")
    ax.set_ylabel("rank 0's wait for its batch (ms)")
    ax.set_title("Data wait per step", fontsize=10)
    legend_beside(ax)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_loader_timelines(result: dict, names=None, steps=None, rank: int = 0):
    """Rank ``rank``'s spans over a few steady steps, one panel per configuration, on one time scale."""
    names = list(names) if names is not None else [result["rows"][0]["name"], result["rows"][2]["name"]]
    steps = list(steps) if steps is not None else list(range(1, min(4, result["steps_per_epoch"])))
    fig, axes = plt.subplots(len(names), 1, figsize=(10, 1.4 + 1.3 * len(names)), sharex=True)
    axes = [axes] if len(names) == 1 else list(axes)
    for ax, name in zip(axes, names):
        plot_gantt({rank: result["spans"][name][rank]}, steps=steps, ax=ax, title=name)
        ax.title.set_fontsize(10)
    for ax in axes[:-1]:
        ax.set_xlabel("")
    axes[-1].set_xlabel(f"time from the start of step {steps[0]} (ms)")
    fig.tight_layout()
    return fig


def pipeline_table(result: dict):
    rows = []
    for r in result["rows"]:
        pin = r["config"]["pin_memory"]
        d = r["wait_spread"]
        rows.append([r["name"], f"{r['median_wait_s'] * 1e3:.1f} ({d['low'] * 1e3:.1f}-{d['high'] * 1e3:.1f})",
                     f"{r['first_batch_wait_s'] * 1e3:.1f}",
                     f"{r['median_compute_s'] * 1e3:.1f}", f"{r['steady_idle_fraction']:.0%}",
                     f"{r['idle_fraction']:.0%}",
                     ("used" if r["pin_memory_effective"] else "skipped (no CUDA)") if pin else "-",
                     "yes" if r["epoch_orders_repeat"] else "no"])
    return html_table(["loader", "data wait (ms): median (interval)", "epoch's first batch (ms)", "compute (ms)", "idle (steady)",
                       "idle (all steps)", "pin_memory", "epochs repeat the order?"], rows, align="lrrrrrll")


def epoch_orders_table(result: dict, count: int = 8):
    """The first samples rank 0 saw in each epoch, with and without ``set_epoch``."""
    rows = []
    for r in result["rows"]:
        for epoch, order in enumerate(r["orders_rank0"]):
            rows.append([r["name"], epoch, ", ".join(str(i) for i in order[:count]) + ", ..."])
    return html_table(["loader", "epoch", f"first {count} sample indices on rank 0"], rows, align="lrl")


def render(result: dict) -> None:
    show(plot_step_breakdown(result))
    show(plot_waits_per_step(result))
    display(pipeline_table(result))
