"""Plots and tables for ``notebooks/06_compression.ipynb`` (data from ``dpteach.experiments.compression_tradeoff``
and ``compression_bytes``)."""
from __future__ import annotations

import matplotlib.pyplot as plt
from IPython.display import display

from ..sync import strategy_class
from .rendering import dress, html_table, human_bytes, legend_below, show




def plot_drift(result: dict):
    """max |theta - theta_single| after every step, per strategy, against the exactness tolerance."""
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for row in result["rows"]:
        steps = range(1, len(row["drift_per_step"]) + 1)
        # a drift of exactly 0 cannot be drawn on a log axis: show it at the axis floor
        values = [max(d, 1e-9) for d in row["drift_per_step"]]
        ax.plot(steps, values, marker="o", markersize=3, color=strategy_class(row["strategy"]).colour,
                label=strategy_class(row["strategy"]).title())
    ax.axhline(result["tolerance"], color="black", linestyle="--", linewidth=1,
               label=f"float32 rounding tolerance ({result['tolerance']:g})")
    ax.set_yscale("log")
    ax.set_ylim(1e-9, None)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("max |theta - theta_single-process|")
    ax.set_title(f"Drift from single-process training: {result['model']}, W={result['world_size']} "
                 f"({result['backend']}, {result['device']})", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig


def tradeoff_table(result: dict):
    rows = []
    for row in result["rows"]:
        same = row["max_abs_diff_vs_single"] <= result["tolerance"]
        rows.append([strategy_class(row["strategy"]).title(), human_bytes(row["bytes_per_step"]),
                     f"{row['bytes_vs_fp32']:.3f}", f"{row['max_abs_diff_vs_single']:.1e}", f"{row['losses'][-1]:.4f}",
                     "yes" if same else "<b>no</b>"])
    # no step times here: these runs train one after another, so their times met different moments of the
    # machine; the panel on two links times the same strategies side by side, step by step
    return html_table(["strategy", "sent / step", "vs float32", "final max |dtheta|",
                       "final loss", "equals single process?"], rows, align="lrrrrl")


def plot_bytes(bytes_result: dict):
    """Bytes per step at each world size: the strategies' counters (bars) and the formula (black ticks)."""
    rows = bytes_result["rows"]
    worlds = sorted({r["world_size"] for r in rows})
    strategies = list(dict.fromkeys(r["strategy"] for r in rows))
    width = 0.8 / len(strategies)
    fig, ax = plt.subplots(figsize=(9, 4))
    for j, name in enumerate(strategies):
        xs = [i + (j - (len(strategies) - 1) / 2) * width for i in range(len(worlds))]
        by_world = {r["world_size"]: r for r in rows if r["strategy"] == name}
        ax.bar(xs, [by_world[w]["measured"] / 2**20 for w in worlds], width, color=strategy_class(name).colour,
               label=f"{strategy_class(name).title()} (counter)")
        ax.plot(xs, [by_world[w]["formula"] / 2**20 for w in worlds], linestyle="none", marker="_",
                markersize=18, color="black", label="formula" if j == 0 else None)
    ax.set_xticks(range(len(worlds)), [f"W={w}" for w in worlds])
    dress(ax, "world size (one gradient exchange measured in each world)", "MiB each rank sends per step",
          f"int8 all-gather vs ring all-reduce: {bytes_result['model']} gradients, "
          f"bucket cap {bytes_result['bucket_mb']:g} MiB", grid="y", legend="beside", title_size=10)
    fig.tight_layout()
    return fig


def bytes_table(bytes_result: dict):
    fp32 = {r["world_size"]: r["measured"] for r in bytes_result["rows"] if r["strategy"] == "bucketed"}
    rows = [[r["world_size"], strategy_class(r["strategy"]).title(), f"{r['formula']:,}", f"{r['measured']:,}",
             f"{r['measured'] / fp32[r['world_size']]:.3f}" if r["world_size"] in fp32 else "-"]
            for r in bytes_result["rows"]]
    return html_table(["W", "strategy", "formula (bytes)", "counter (bytes)", "vs float32"], rows, align="rlrrr")


def render(result: dict) -> None:
    show(plot_drift(result))
    display(tradeoff_table(result))


def show_half_range(half: dict) -> None:
    """Table of ``half_precision_range``: subnormal and zero shares of the gradient values, per W and format."""
    display(html_table(["divided by W", "format", "subnormal (fewer bits)", "rounded to zero"],
                       [[r["world_size"], r["format"], f"{r['subnormal']:.2%}", f"{r['underflow']:.3%}"]
                        for r in half["rows"]], align="rlrr"))


def plot_on_links(result: dict):
    """Left: loss per step (the same on every link). Right: time per step, per strategy and link."""
    links = [link["name"] for link in result["links"]]
    strategies = list(dict.fromkeys(r["strategy"] for r in result["rows"]))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name in strategies:
        row = next(r for r in result["rows"] if r["strategy"] == name)
        left.plot(range(1, len(row["losses"]) + 1), row["losses"], marker=".", label=name)
    left.set_xlabel("optimizer step")
    left.set_ylabel("training loss")
    left.set_title("Loss per step: the same on every link", fontsize=10)
    legend_below(left, ncol=2)
    width = 0.8 / len(links)
    for j, link in enumerate(links):
        runs = [next(r for r in result["rows"] if r["strategy"] == s and r["link"] == link) for s in strategies]
        times = [r["step_time_s"] * 1e3 for r in runs]
        # the bar is the step's median; the error bar, the interval of the timed steps (interleaved rounds)
        below = [max(0.0, t - r["spread"]["step_s"]["low"] * 1e3) for t, r in zip(times, runs)]
        above = [max(0.0, r["spread"]["step_s"]["high"] * 1e3 - t) for t, r in zip(times, runs)]
        right.bar([i + (j - (len(links) - 1) / 2) * width for i in range(len(strategies))], times, width,
                  yerr=[below, above], capsize=3, label=f"emulated {link}")
    right.axhline(result["local_step_s"] * 1e3, color="grey", linestyle="--", label="local (no communication)")
    right.set_xticks(range(len(strategies)), strategies)
    right.set_ylabel("time per step (ms): median,\nbars: interval of the timed steps")
    right.set_title("Time per step: where the bytes saved are worth their cost", fontsize=10)
    legend_below(right, ncol=2)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def links_table(result: dict):
    rows = [[r["strategy"], r["link"], human_bytes(r["bytes_per_step"]), step_ms(r["step_time_s"], r["spread"]["step_s"]),
             r["time_set_by"] or "-"] for r in result["rows"]]
    return html_table(["strategy", "link", "sent / step", "step (ms): median (interval)", "time set by"], rows,
                      align="llrrl")


def step_ms(value: float, spread: dict) -> str:
    """``43.3 (41.0-47.9)``: the step's median in ms, then the interval of the timed steps."""
    return f"{value * 1e3:.1f} ({spread['low'] * 1e3:.1f}-{spread['high'] * 1e3:.1f})"


def render_on_links(result: dict) -> None:
    show(plot_on_links(result))
    display(links_table(result))
