"""Plots and tables for lesson 03: bucket assignments and the bucket-size sweep."""
from __future__ import annotations

from .prediction import Prediction
from .rendering import dress, human_bytes, legend_beside, show, table


def _layers(names: list[str]) -> str:
    """'net.10.bias', 'net.10.weight', 'net.8.bias' -> 'net.10, net.8' (the layers a bucket covers)."""
    layers = []
    for name in names:
        layer = name.rsplit(".", 1)[0]
        if layer not in layers:
            layers.append(layer)
    return ", ".join(layers)


def plot_assignment(plan: dict):
    """One bar per bucket, in launch order, labelled with the layers whose gradients it carries."""
    import matplotlib.pyplot as plt
    buckets, model, bucket_mb, first_mb = plan["buckets"], plan["model"], plan["bucket_mb"], plan["first_bucket_mb"]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(buckets) + 1.6))
    sizes = [b["bytes"] / 2**20 for b in buckets]
    ax.barh([f"bucket {b['index']}" for b in buckets], sizes, color="#4C72B0")
    for i, b in enumerate(buckets):
        ax.text(sizes[i], i, f"  {_layers(b['params'])}  ({len(b['params'])} tensors)", va="center",
                fontsize="small")
    ax.axvline(bucket_mb, color="#C44E52", linestyle="--", label=f"cap {bucket_mb:g} MiB")
    ax.axvline(first_mb, color="#DD8452", linestyle=":", label=f"first-bucket cap {first_mb:g} MiB")
    ax.invert_yaxis()
    ax.set_xlim(0, max(sizes + [bucket_mb]) * 1.9)
    dress(ax, "bucket size (MiB of float32 gradients)", None,
          f"{model}: {len(buckets)} buckets at bucket_mb={bucket_mb:g} (launch order, top first)", grid="x",
          legend="beside")
    fig.tight_layout()
    return fig


def render_assignment(plan: dict) -> None:
    print(f"{plan['model']}: {plan['num_tensors']} gradient tensors, {human_bytes(plan['grad_bytes'])}; "
          f"model order: {', '.join(plan['parameters'])}\n")
    table(["bucket", "parameters (last layer first)", "size"],
          [[b["index"], ", ".join(b["params"]), human_bytes(b["bytes"])] for b in plan["buckets"]])
    show(plot_assignment(plan))


def _waited_ms(row: dict) -> float:
    """A row's exposed communication per step in ms: the median of its timed steps where the row has their
    interval (so that the point sits inside its bar), else the run's own figure."""
    spread = row.get("exposed_spread")
    return (spread["median"] if spread else row["exposed_comm_s"]) * 1e3


def _bars(rows: list[dict]) -> list[list[float]] | None:
    """Error bars (ms below, ms above the median) from each row's interval of exposed communication."""
    if not all(r.get("exposed_spread") for r in rows):
        return None
    return [[_waited_ms(r) - r["exposed_spread"]["low"] * 1e3 for r in rows],
            [r["exposed_spread"]["high"] * 1e3 - _waited_ms(r) for r in rows]]


def _ms(row: dict, value: str, interval: str) -> str:
    """``12.3 (11.9-13.0)``: a row's median in ms and, where the row has one, its interval."""
    if row.get(value) is None:
        return "-"
    spread = row.get(interval)
    if spread is None:
        return f"{row[value] * 1e3:.1f}"
    return f"{spread['median'] * 1e3:.1f} ({spread['low'] * 1e3:.1f}-{spread['high'] * 1e3:.1f})"


def plot_sweep(result: dict):
    """Exposed communication per step against the bucket size, one line per strategy swept."""
    import matplotlib.pyplot as plt
    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(9.5, 4.5))
    colours = {"bucketed": "#4C72B0", "overlap": "#55A868"}
    for strategy in result.get("strategies", ("bucketed",)):
        mine = sorted((r for r in rows if r["strategy"] == strategy), key=lambda r: r["bucket_mb"])
        ax.errorbar([r["bucket_mb"] for r in mine], [_waited_ms(r) for r in mine], yerr=_bars(mine),
                    fmt="o-", capsize=3, color=colours.get(strategy),
                    label=f"{strategy}: exposed communication (measured; bars: interval of the median)")
        for r in mine:
            ax.annotate(f"{r['messages_per_step']}", (r["bucket_mb"], _waited_ms(r)),
                        textcoords="offset points", xytext=(0, 7), ha="center", fontsize="x-small",
                        color=colours.get(strategy))
    sweep = sorted((r for r in rows if r["strategy"] == result.get("strategies", ("bucketed",))[0]),
                   key=lambda r: r["bucket_mb"])
    ax.plot([r["bucket_mb"] for r in sweep], [r["predicted_comm_s"] * 1e3 for r in sweep], "^--", color="#C44E52",
            alpha=0.7, label="all-reduces predicted: messages x 2(W-1)alpha + bytes x beta")
    naive = next(r for r in rows if r["strategy"] == "naive")
    ax.axhline(_waited_ms(naive), color="grey", linestyle=":",
               label=f"naive: one all-reduce per tensor ({naive['messages_per_step']} messages)")
    ax.set_xscale("log")
    sizes = sorted({r["bucket_mb"] for r in rows if r["bucket_mb"] is not None})
    ax.set_xticks(sizes, [f"{size:g}" for size in sizes])  # a readable label at every size swept
    ax.minorticks_off()
    ax.set_xlabel("bucket size cap (MiB, log scale); the small numbers are messages per step")
    ax.set_ylabel("communication waited for (ms per step)")
    ax.set_ylim(bottom=0)
    link = result.get("link")
    where = f"emulated link {link['name']}" if link else "this machine's own transfers"
    ax.set_title(f"{result['model']}, W={result['world_size']}, {where}: what communication adds to a step",
                 fontsize="medium")
    legend_beside(ax)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def render_sweep(result: dict) -> None:
    link = result.get("link")
    source = f"the emulated link {link['name']}" if link else "measured in the same world"
    print(f"{source}: alpha = {result['alpha_s'] * 1e6:.0f} us per message, so each all-reduce pays about "
          f"{result['latency_per_allreduce_s'] * 1e3:.2f} ms of latency at W={result['world_size']}\n")
    timed = next((r["step_spread"]["n"] for r in result["rows"] if r.get("step_spread")), None)
    if timed:
        print(f"step and exposed: the median of {timed} timed steps, taken side by side, and its interval "
              f"(dpteach/measure.py)")
    table(["configuration", "messages/step", "step (ms)", "exposed (ms)", "overhead (ms)", "predicted comm (ms)",
           "on the wire per step", "max|dtheta| vs naive", "time set by"],
          [[r["label"], r["messages_per_step"], _ms(r, "step_time_s", "step_spread"),
            _ms(r, "exposed_comm_s", "exposed_spread"),
            "-" if r.get("overhead_s") is None else f"{r['overhead_s'] * 1e3:.1f}",
            f"{r['predicted_comm_s'] * 1e3:.1f}", human_bytes(r["bytes_per_step"]),
            "-" if r["max_abs_diff_vs_naive"] is None else f"{r['max_abs_diff_vs_naive']:.1g}",
            r.get("time_set_by") or "-"]
           for r in result["rows"]])
    show(plot_sweep(result))


# -- the lesson's prediction (prediction.py shows and scores it): lesson 03: how many buckets ----------------------

def _bucket_count(result: dict) -> float | None:
    return len(result.get("buckets", [])) or None


def _explain_buckets(result: dict, predicted: float) -> str:
    largest = max(result["buckets"], key=lambda b: b["bytes"])
    return (f"The {result['model']}'s {result['num_tensors']} gradient tensors hold {human_bytes(result['grad_bytes'])}. "
            f"The rule walks them last layer first and closes a bucket when the next tensor would take it past the "
            f"cap ({human_bytes(result['bucket_mb'] * 2**20)}; the first bucket's own cap "
            f"{human_bytes(result['first_bucket_mb'] * 2**20)}), so a tensor larger than the cap makes a bucket of its "
            f"own - the largest here holds {human_bytes(largest['bytes'])}. Dividing the total by the cap counts too "
            f"few whenever tensors do not fill their buckets exactly.")


BUCKET_COUNT = Prediction(
    key="03-bucket-count", lesson="03", unit="buckets",
    question=("How many <b>buckets</b> will the rule make of the chosen model's gradients with the slider's cap? "
              "(Lesson 01 lists each layer's size.)"),
    measure=_bucket_count, explain=_explain_buckets, obtained="computed")
