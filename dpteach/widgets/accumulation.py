"""Plots and tables for ``notebooks/05_accumulation.ipynb`` (data from ``dpteach.experiments.accumulation_sweep``)."""
from __future__ import annotations

import matplotlib.pyplot as plt
from IPython.display import HTML, display

from .gantt import plot_gantt
from .prediction import Prediction
from .rendering import html_table, human_bytes, legend_below, show


def k_values(k_max: int) -> list[int]:
    """The K values a sweep up to ``k_max`` compares: 1, 2, 4, ... and ``k_max`` itself."""
    ks, k = [], 1
    while k < k_max:
        ks.append(k)
        k *= 2
    return sorted(set(ks + [k_max]))


def plot_cost_per_sample(result: dict):
    """Left: bytes each sample costs on the wire. Right: time per optimizer step, compute vs exposed communication."""
    rows = result["rows"]
    labels = [f"K={r['accum_steps']}\n{r['effective_batch']} samples" for r in rows]
    x = range(len(rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    per_sample = [r["bytes_per_sample"] / 1024 for r in rows]
    left.bar(x, per_sample, color="#DD8452")
    for i, value in enumerate(per_sample):
        left.text(i, value, f"{value:.0f}", ha="center", va="bottom", fontsize=9)
    left.set_xticks(list(x), labels, fontsize=9)
    left.set_ylabel("gradient bytes sent per sample (KiB)")
    left.set_title("Communication per sample falls as 1/K", fontsize=10)
    left.set_ylim(0, max(per_sample) * 1.18)
    floor = [r["compute_floor_s"] * 1e3 for r in rows]
    exposed = [r["exposed_comm_s"] * 1e3 for r in rows]
    overhead = [(r["overhead_s"] or 0.0) * 1e3 for r in rows]
    right.bar(x, floor, color="#55A868", label="compute (local run, same K)")
    right.bar(x, exposed, bottom=floor, color="#C44E52", label="communication waited for")
    right.bar(x, overhead, bottom=[f + e for f, e in zip(floor, exposed)], color="#B0B0B0", label="overhead")
    # the whole bar is the step's median; its error bar, the interval of the timed steps (interleaved rounds)
    tops = [f + e + o for f, e, o in zip(floor, exposed, overhead)]
    steps = [r["spread"]["step_s"] for r in rows]
    right.errorbar(list(x), tops, yerr=[[max(0.0, t - s["low"] * 1e3) for t, s in zip(tops, steps)],
                                        [max(0.0, s["high"] * 1e3 - t) for t, s in zip(tops, steps)]],
                   fmt="none", ecolor="black", capsize=4, label="step: interval of the timed steps")
    right.set_xticks(list(x), labels, fontsize=9)
    right.set_ylabel("time per optimizer step (ms)")
    right.set_title("...but every step still ends with the exchange", fontsize=10)
    right.set_ylim(0, max(max(tops), max(s["high"] * 1e3 for s in steps)) * 1.3)
    legend_below(right, ncol=2)
    for ax in (left, right):
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{result['strategy']}, {result['model']}, W={result['world_size']} ({result['backend']}, "
                 f"{result['device']}), B={result['batch_per_rank']} per micro-batch", fontsize=10)
    fig.tight_layout()
    return fig


def plot_accumulation_timeline(result: dict, k: int | None = None, ranks=None):
    """One optimizer step with K micro-batches: K forward/backward pairs, then the exchange."""
    k = k if k is not None else result["rows"][-1]["accum_steps"]
    ranks = list(ranks) if ranks is not None else list(range(min(2, result.get("real_ranks", result["world_size"]))))
    fig, ax = plt.subplots(figsize=(10, 1.6 + 0.95 * len(ranks)))
    plot_gantt({r: result["timelines"][k][r] for r in ranks}, ax=ax, device=result["device"],
               title=f"one optimizer step with K={k} micro-batches ({result['strategy']}): "
                     f"communication only after the last one")
    ax.title.set_fontsize(10)
    ax.set_xlabel("time from the start of the step (ms)")
    fig.tight_layout()
    return fig


def interval_ms(value: float, spread: dict | None) -> str:
    """``48.8 (47.1-52.0)``: the figure's number in ms, then the interval of the timed steps (when measured)."""
    if spread is None:
        return f"{value * 1e3:.1f}"
    return f"{value * 1e3:.1f} ({spread['low'] * 1e3:.1f}-{spread['high'] * 1e3:.1f})"


def sweep_table(result: dict):
    rows = []
    for r in result["rows"]:
        diff = r["max_abs_diff_vs_large_batch"]  # None with emulated peers: one rank shows no equivalence
        same = None if diff is None else diff <= result["tolerance"]
        rows.append([r["accum_steps"], r["effective_batch"], f"{r['messages_per_step']:.0f}",
                     human_bytes(r["bytes_per_step"]), human_bytes(r["bytes_per_sample"]),
                     interval_ms(r["step_time_s"], r["spread"]["step_s"]),
                     interval_ms(r["exposed_comm_s"], r["spread"].get("exposed_s")),
                     "-" if diff is None else f"{diff:.1e}", "-" if same is None else ("yes" if same else "<b>no</b>")])
    return html_table(["K", "effective batch B*W*K", "messages / step", "sent / step", "sent / sample",
                       "step (ms): median (interval)", "exposed comm (ms)", "max |dtheta| vs large batch", "equal?"], rows, align="rrrrrrrrl")


def bugs_table(result: dict):
    ns, lb = result["no_sync"], result["loss_not_divided"]
    if ns is None:  # emulated peers: the bugs need real ranks to show
        return HTML("<p>The two classic bugs need real ranks to show (no_sync counts the all-reduces DDP "
                    "launches between ranks); run with real ranks to see them.</p>")
    before, after = ns["before_forward"], ns["after_forward"]
    return html_table(["what the loop does", "all-reduces in one step", "all-reduced in one step", "gradient"], [
        ["no_sync() entered before forward (right)", before["all_reduces"], human_bytes(before["bytes"]),
         f"norm {lb['grad_norm_divided']:.4f} (large batch: {lb['grad_norm_large_batch']:.4f})"],
        ["no_sync() entered after forward (bug)", after["all_reduces"], human_bytes(after["bytes"]),
         f"same values, K={ns['k']} times the traffic"],
        [f"loss not divided by K={lb['k']} (bug)", "-", "-",
         f"norm {lb['grad_norm_not_divided']:.4f} = {lb['norm_ratio']:.3f} x the large batch's"],
    ], align="lrrl")


def render(result: dict) -> None:
    show(plot_cost_per_sample(result))
    show(plot_accumulation_timeline(result))
    display(sweep_table(result))
    display(bugs_table(result))


def sweep_up_to(k_max: int = 4, trace=None, **options) -> dict:
    """``accumulation_sweep`` over ``k_values(k_max)``: what the panel's K slider runs (``trace``: see there)."""
    from ..experiments.accumulation import accumulation_sweep
    return accumulation_sweep(accum_steps_list=k_values(k_max), trace=trace, **options)


# -- the lesson's prediction (prediction.py shows and scores it): lesson 05: communication per sample --------------

def _per_sample_at_largest_k(result: dict) -> float | None:
    rows = sorted(result.get("rows", []), key=lambda row: row["accum_steps"])
    if len(rows) < 2 or rows[0]["accum_steps"] != 1 or not rows[0]["exposed_comm_per_sample_s"]:
        return None
    return rows[-1]["exposed_comm_per_sample_s"] / rows[0]["exposed_comm_per_sample_s"]


def _explain_accumulation(result: dict, predicted: float) -> str:
    rows = sorted(result["rows"], key=lambda row: row["accum_steps"])
    one, most = rows[0], rows[-1]
    return (f"With K={most['accum_steps']} a step sends the same bytes as with K=1 but trains on K times the samples: "
            f"bytes per sample fell to {most['bytes_per_sample'] / one['bytes_per_sample']:.3g} of K=1's, exactly "
            f"1/K. The waiting per sample follows only as far as each step's exchange costs the same: it was "
            f"{one['exposed_comm_s'] * 1e3:.3g} ms per step at K=1 and {most['exposed_comm_s'] * 1e3:.3g} ms at "
            f"K={most['accum_steps']} (noise on a shared machine, and a longer backward to hide behind).")


ACCUMULATION_PER_SAMPLE = Prediction(
    key="05-exposed-per-sample-largest-k", lesson="05", unit="x K=1's",
    question=("At the <b>largest K</b> of the sweep, what will the communication the ranks wait for <b>per sample</b> "
              "be, as a fraction of K=1's?"),
    measure=_per_sample_at_largest_k, explain=_explain_accumulation)
