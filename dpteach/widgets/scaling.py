"""Plots and tables for lesson 09: measured scaling on this machine, and the simulator's extrapolation."""
from __future__ import annotations

from ..replica.timeline import COLORS
from .prediction import Prediction
from .rendering import legend_below, legend_beside, show, table


PHASE_COLORS = {"forward": COLORS["forward"], "backward": COLORS["backward"], "optimizer": COLORS["optimizer"],
                "wait": COLORS["wait"], "data_and_other": COLORS["data"]}
PHASE_LABELS = {"forward": "forward", "backward": "backward (all-reduces overlap it)", "optimizer": "optimizer",
                "wait": "waiting for all-reduces", "data_and_other": "batch fetch + other"}


def plot_measured(result: dict):
    """Left: throughput against ideal linear scaling. Right: where each step's time goes."""
    import matplotlib.pyplot as plt
    rows = result["rows"]
    ws = [r["world_size"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    one = rows[0]["samples_per_s"]
    left.plot(ws, [w * one for w in ws], "--", color="grey", label="ideal: W x throughput(1)")
    left.plot(ws, [r["samples_per_s"] for r in rows], "o-", color="#4C72B0", label=f"measured ({result['strategy']})")
    if all("step" in r for r in rows):  # the interval of each median step, as samples per second
        per = [r["world_size"] * r["batch_per_rank"] for r in rows]
        left.errorbar(ws, [r["samples_per_s"] for r in rows], fmt="none", ecolor="#4C72B0", capsize=3,
                      yerr=[[r["samples_per_s"] - n / r["step"]["high"] for r, n in zip(rows, per)],
                            [n / r["step"]["low"] - r["samples_per_s"] for r, n in zip(rows, per)]])
    for r in rows:
        left.annotate(f"{r['efficiency']:.0%}", (r["world_size"], r["samples_per_s"]), textcoords="offset points",
                      xytext=(0, 8), ha="center", fontsize="small")
    for r in rows:
        if r["oversubscribed"]:
            left.axvspan(r["world_size"] - 0.4, r["world_size"] + 0.4, color="#C44E52", alpha=0.08)
    left.set_xticks(ws)
    shared = "GPUs" if result.get("device") == "cuda" else "CPU cores"
    left.set_xlabel(f"ranks W (shaded: more ranks than {shared})")
    left.set_ylabel("samples per second (all ranks)")
    left.set_title("Throughput; labels = scaling efficiency")
    left.set_ylim(bottom=0)
    legend_below(left, ncol=1)
    bottom = [0.0] * len(rows)
    for phase, color in PHASE_COLORS.items():
        values = [r["breakdown"][phase] * 1e3 for r in rows]
        right.bar(ws, values, bottom=bottom, color=color, label=PHASE_LABELS[phase])
        bottom = [b + v for b, v in zip(bottom, values)]
    right.hlines([r["local_step_s"] * 1e3 for r in rows], [w - 0.4 for w in ws], [w + 0.4 for w in ws],
                 colors="black", linewidth=2.5, label="local step (same work, no communication)")
    right.set_xticks(ws)
    right.set_xlabel("ranks W")
    right.set_ylabel("milliseconds per step")
    batch = (f"global batch {result['global_batch']} shared by the W ranks" if result.get("scaling") == "strong"
             else f"batch {result['batch_per_rank']} per rank")
    right.set_title(f"One step of {result['model']}, {batch}", fontsize="medium")
    legend_below(right, ncol=2)
    right.set_ylim(0, max(bottom + [r["local_step_s"] * 1e3 for r in rows]) * 1.1)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _ms(row: dict, key: str, median_key: str) -> str:
    """A step time in ms with its interval where the run measured one: ``12.3 (11.9-13.0)``."""
    spread = row.get(key)
    if not spread:
        return f"{row[median_key] * 1e3:.1f}"
    return f"{spread['median'] * 1e3:.1f} ({spread['low'] * 1e3:.1f}-{spread['high'] * 1e3:.1f})"


def _efficiency(row: dict) -> str:
    low, high = row.get("efficiency_interval", (row["efficiency"], row["efficiency"]))
    return f"{row['efficiency']:.0%}" + ("" if low == high else f" ({low:.0%}-{high:.0%})")


def render_measured(result: dict) -> None:
    table(["W", "step (ms), median (interval)", "local (ms)", "exposed comm (ms)", "wait (ms)", "fetch+other (ms)",
           "samples/s", "speedup", "efficiency (interval)", "a device per rank?"],
          [[r["world_size"], _ms(r, "step", "step_time_s"), _ms(r, "local_step", "local_step_s"),
            f"{r['exposed_comm_s'] * 1e3:.1f}", f"{r['breakdown']['wait'] * 1e3:.1f}",
            f"{r['breakdown']['data_and_other'] * 1e3:.1f}", f"{r['samples_per_s']:,.0f}", f"{r['speedup']:.2f}x",
            _efficiency(r), "no" if r["oversubscribed"] else "yes"] for r in result["rows"]])
    if result.get("throughput"):
        print("Time per sample: " + result["throughput"]["sentence"].replace("`", ""))
    shared = [r for r in result["rows"] if r.get("sharing")]
    if shared:
        print(f"Note: {shared[0]['sharing']}.")
    show(plot_measured(result))


def plot_simulation(curves: dict, measured: dict | None = None, title: str = ""):
    """Predicted efficiency against W (log scale) for each scenario; optional measured points."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9.5, 4.5))
    for name, rows in curves.items():
        ax.plot([r["world_size"] for r in rows], [r["efficiency"] for r in rows], "o-", markersize=4, label=name)
    if measured:
        ax.plot([r["world_size"] for r in measured["rows"]], [r["efficiency"] for r in measured["rows"]], "k*",
                markersize=11, label="measured on this machine")
    ax.set_xscale("log", base=2)
    ws = sorted({r["world_size"] for rows in curves.values() for r in rows})
    ticks = ws if len(ws) <= 8 else [w for w in ws if w in (1, 4, 16, 64, 256, 1024, 4096)]
    ax.set_xticks(ticks, [str(w) for w in ticks])
    ax.minorticks_off()
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("ranks W (log scale)")
    ax.set_ylabel("scaling efficiency (1 = linear)")
    ax.set_title(title or "Predicted scaling efficiency")
    legend_beside(ax)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def render_simulation(result: dict) -> None:
    """``result`` from ``scaling_simulation``: its curves, a table at a few W, and the plot."""
    marks = [w for w in (2, 8, 64, 512, 4096) if w <= result["max_world_size"]]
    for name, rows in result["curves"].items():
        by_w = {r["world_size"]: r for r in rows}
        table(["W", "all-reduce (ms)", "exposed (ms)", "step (ms)", "efficiency", "algorithm"],
              [[w, f"{by_w[w]['comm_s'] * 1e3:.2f}", f"{by_w[w]['exposed_s'] * 1e3:.2f}",
                f"{by_w[w]['step_s'] * 1e3:.2f}", f"{by_w[w]['efficiency']:.0%}", "+".join(by_w[w]["algorithms"])]
               for w in marks if w in by_w], title=f"\n{name}")
    show(plot_simulation(result["curves"], title=result["title"]))


def plot_weak_and_strong(weak: dict, strong: dict):
    """Speedup against W: weak scaling (batch per rank fixed) beside strong scaling (global batch fixed)."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    ws = sorted({r["world_size"] for r in weak["rows"]} | {r["world_size"] for r in strong["rows"]})
    ax.plot(ws, ws, "--", color="grey", label="ideal: W x")
    for result, colour, label in ((weak, "#4C72B0", f"weak: {weak['batch_per_rank']} samples per rank"),
                                  (strong, "#DD8452", f"strong: {strong['global_batch']} samples in all")):
        ax.plot([r["world_size"] for r in result["rows"]], [r["speedup"] for r in result["rows"]], "o-",
                color=colour, label=label)
    ax.set_xticks(ws)
    ax.set_xlabel("ranks W")
    ax.set_ylabel("speedup: samples/s at W over samples/s at W=1")
    ax.set_title("Weak and strong scaling on this machine", fontsize="medium")
    ax.set_ylim(bottom=0)
    legend_beside(ax)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


# -- the lesson's prediction (prediction.py shows and scores it): lesson 09: efficiency at scale -------------------

def _efficiency_at_largest_w(result: dict) -> float | None:
    curves = dict(zip(result.get("names", []), result.get("curves", {}).values()))
    rows = curves.get("ib_8nics")
    return 100 * rows[-1]["efficiency"] if rows else None


def _explain_efficiency(result: dict, predicted: float) -> str:
    curves = dict(zip(result["names"], result["curves"].values()))
    last = curves["ib_8nics"][-1]
    return (f"At W={last['world_size']} one step computes for {last['compute_s'] * 1e3:.3g} ms and communicates for "
            f"{last['comm_s'] * 1e3:.3g} ms in {last['messages']} messages; {result['overlap']:.0%} of the compute can "
            f"hide it, so {last['exposed_s'] * 1e3:.3g} ms stays exposed. The ring's bandwidth term hardly grows with "
            f"W, but its 2(W-1) latencies per message do: at large W they, not the bytes, set the step.")


SCALING_EFFICIENCY = Prediction(
    key="09-efficiency-largest-w", lesson="09", unit="%",
    question=("With the panel's workload, what <b>efficiency</b> will the model give at the largest W over "
              "<b>InfiniBand with 8 NICs per node</b> (100% = perfect scaling)?"),
    measure=_efficiency_at_largest_w, explain=_explain_efficiency)
