"""A Gantt chart of what each rank did, and when: the picture lessons 04, 05 and 08 read overlap from.

Each rank gets a band with two rows, compute above communication (``dpteach/replica/timeline.py`` records
the spans). A comm bar under a compute bar of the same rank is communication hidden behind compute;
a comm bar under a gap is communication the step waited for.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from ..replica.timeline import COLORS
from .rendering import legend_beside


def plot_gantt(timelines: dict, steps=None, ax=None, title: str | None = None, device: str = "cpu"):
    """Draw one band per rank, with its compute row above its communication row.

    ``timelines`` maps rank -> list of spans; ``steps`` restricts to some step numbers. On GPU ranks
    (``device="cuda"``) the rows are the two CUDA streams the spans were timed on: compute, and the
    stream the collectives ran on (NCCL's, or the emulated link's).
    """
    rows = ("comm stream", "compute stream") if device == "cuda" else ("comm", "compute")
    ranks = sorted(timelines)
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.9 * len(ranks) + 1.2))
    spans_by_rank = {r: [s for s in timelines[r] if steps is None or s["step"] in steps] for r in ranks}
    t0 = min((s["start"] for spans in spans_by_rank.values() for s in spans), default=0.0)
    yticks, ylabels, used = [], [], set()
    for row, rank in enumerate(reversed(ranks)):
        base = row * 3
        # Collectives of different kinds in flight at once (zero3's reduce-scatters launched in backward
        # while the next layer's all-gather runs) get a strip each, so that none hides another.
        kinds = sorted({s["name"] for s in spans_by_rank[rank] if s["lane"] == "comm"})
        for span in spans_by_rank[rank]:
            y, height = base + (1.0 if span["lane"] == "compute" else 0.0), 0.9
            if span["lane"] == "comm" and len(kinds) > 1:
                height = 0.9 / len(kinds)
                y += height * kinds.index(span["name"])
            key = "comm" if span["lane"] == "comm" and span["name"] not in COLORS else span["name"]
            used.add(key)
            ax.broken_barh([((span["start"] - t0) * 1e3, (span["end"] - span["start"]) * 1e3)], (y, height),
                           facecolors=COLORS.get(key, "#999999"), edgecolor="white", linewidth=0.3)
        yticks += [base + 0.45, base + 1.45]
        ylabels += [f"rank {rank} {rows[0]}", f"rank {rank} {rows[1]}"]
    ax.set_yticks(yticks, ylabels)
    ax.set_xlabel("time from the first span drawn (ms)")
    legend_beside(ax, handles=[Patch(color=COLORS.get(k, "#999999"), label=k) for k in COLORS if k in used])
    if title:
        ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    return ax
