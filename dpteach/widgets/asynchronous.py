"""Plots and tables for ``notebooks/07_sync_vs_async.ipynb`` (data from ``dpteach.experiments.async_staleness``)."""
from __future__ import annotations

from collections import Counter

import matplotlib.pyplot as plt
from IPython.display import display

from .rendering import dress, html_table, legend_beside, show


RUN_STYLE = {"sync": ("#4C72B0", "-"), "sync_slow": ("#4C72B0", "--"), "slow": ("#8172B2", "-"),
             "async": ("#C44E52", "-"), "bounded": ("#DD8452", "--")}


def plot_staleness(result: dict):
    """How stale each worker's gradients were (slow-worker run, pushes computed while others still worked)."""
    workers = list(result["staleness"])
    counts = {w: Counter(result["staleness"][w]) for w in workers}
    values = sorted({v for c in counts.values() for v in c})
    width = 0.8 / len(workers)
    fig, ax = plt.subplots(figsize=(9, 4))
    colors = plt.cm.tab10.colors
    for j, worker in enumerate(workers):
        xs = [v + (j - (len(workers) - 1) / 2) * width for v in values]
        slow = worker == result["slow_rank"]
        label = f"worker rank {worker}" + (f" (slow: +{result['slow_ms']:g} ms per update)" if slow else "")
        ax.bar(xs, [counts[worker][v] for v in values], width, color=colors[j % 10], label=label,
               hatch="//" if slow else None, edgecolor="white")
    ax.set_xticks(values)
    dress(ax, "staleness: updates the server applied between this worker's pull and its push", "number of pushes",
          f"Staleness per worker: {result['world_size'] - 1} workers + 1 server ({result['pushes_alone']} "
          f"pushes made after the others had finished left out)", grid="y", legend="beside", title_size=10)
    fig.tight_layout()
    return fig


def plot_loss_curves(result: dict):
    """Held-out loss after every optimizer step, against the number of training samples behind it."""
    fig, ax = plt.subplots(figsize=(9, 4))
    drawn, repeat = set(), 0
    for run in result["runs"]:
        if run["kind"] == "sync" and "sync" in drawn or run["kind"] == "sync_slow":
            continue  # the other sync runs compute the same updates: drawing them would only add clutter
        drawn.add(run["kind"])
        color, style = RUN_STYLE[run["kind"]]
        if run["kind"] == "async":  # the repeats: same colour, one line style each
            style, repeat = ("-", ":", "-.", (0, (5, 1)))[repeat % 4], repeat + 1
        samples = [(i + 1) * run["samples_per_update"] for i in range(len(run["eval_curve"]))]
        ax.plot(samples, [loss for _, loss in run["eval_curve"]], color=color, linestyle=style,
                label=run["label"] if run["kind"] != "sync" else "sync (both runs identical)")
    ax.set_xlabel("training samples behind the weights (sync: B x W per step; async: B per push)")
    ax.set_ylabel("loss on a held-out batch")
    ax.set_title(f"Synchronous vs asynchronous training: {result['model']}, W={result['world_size']}", fontsize=10)
    legend_beside(ax)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_wall_clock(result: dict):
    """Held-out loss against wall-clock seconds, with one slow worker: sync waits for it, async does not."""
    fig, ax = plt.subplots(figsize=(9, 4))
    for run in result["runs"]:
        if run["kind"] not in ("sync_slow", "slow", "bounded"):
            continue
        color, style = RUN_STYLE[run["kind"]]
        ax.plot([t for t, _ in run["eval_curve"]], [loss for _, loss in run["eval_curve"]], color=color,
                linestyle=style, marker=".", label=run["label"])
    ax.set_xlabel("wall-clock seconds since training started (evaluation done afterwards, off this clock)")
    ax.set_ylabel("loss on a held-out batch")
    ax.set_title(f"One worker {result['slow_ms']:g} ms slower per step: what waiting costs, and what staleness costs",
                 fontsize=10)
    legend_beside(ax)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def reproducibility_table(result: dict):
    rows = [["sync run 1 vs sync run 2", f"{result['sync_repeat_diff']:.2e}", "-"]]
    for i, (diff, differ) in enumerate(zip(result["async_repeat_diffs"], result["async_orders_differ"])):
        rows.append([f"async run 1 vs async run {i + 2} (equal workers)", f"{diff:.2e}", "yes" if differ else "no"])
    return html_table(["same seed, same data, run twice", "max |theta_a - theta_b|",
                       "server applied pushes in a different order?"], rows, align="lrl")


def bounded_table(result: dict):
    b = result["bounded"]
    free = next(r for r in result["runs"] if r["kind"] == "slow")["async"]
    stale = [s["staleness"] for s in free["staleness"]]
    return html_table(["slow-worker run", "pushes", "applied", "dropped", "largest staleness applied"], [
        ["no bound", len(stale), free["applied"], free["dropped"], max(stale)],
        [f"max_staleness={b['max_staleness']}", b["pushes"], b["applied"], b["dropped"],
         max((s for s in b["staleness"] if s <= b["max_staleness"]), default="-")],
    ], align="lrrrr")


def render(result: dict) -> None:
    show(plot_staleness(result))
    show(plot_loss_curves(result))
    show(plot_wall_clock(result))
    display(reproducibility_table(result))
    if result["bounded"] is not None:
        display(bounded_table(result))
