"""Plots and tables for lesson 12: what 16-bit forward passes, loss scales and 16-bit gradients cost and save."""
from __future__ import annotations

import math

from .prediction import Prediction
from .rendering import human_bytes, legend_below, show, table

PRECISION_COLORS = {"fp32": "#4C72B0", "bf16": "#55A868", "fp16": "#DD8452"}
RUN_COLORS = ["#55A868", "#C44E52", "#4C72B0"]


def step_ms(row: dict) -> str:
    """``12.3 (11.9-13.0)``: the step's median in ms, then the interval of the timed steps."""
    d = row["spread"]["step_s"]
    return f"{row['step_time_s'] * 1e3:.1f} ({d['low'] * 1e3:.1f}-{d['high'] * 1e3:.1f})"


def plot_precision_drift(result: dict):
    """Losses of the three precisions; and per precision what one forward pass saves for backward."""
    import matplotlib.pyplot as plt
    rows = result["rows"]
    fig, (curve, mem) = plt.subplots(1, 2, figsize=(12, 4.2))
    # The three losses lie within a hair of each other, so a plot of them would show one line: draw
    # each 16-bit run's loss *minus fp32's* at the same step instead, with fp32 as the zero line.
    fp32 = next(r["losses"] for r in rows if r["precision"] == "fp32")
    for r in rows:
        gap = [a - b for a, b in zip(r["losses"], fp32)]
        curve.plot(range(1, len(gap) + 1), gap, color=PRECISION_COLORS[r["precision"]],
                   linestyle="--" if r["precision"] == "fp32" else "-", marker="." if r["precision"] != "fp32" else None,
                   label=f"{r.get('label', r['precision'])} (final loss {r['final_loss']:.4f}, "
                         f"weights' drift {r['relative_drift']:.1%})",
                   linewidth=1.4)
    curve.set_xlabel("step")
    curve.set_ylabel("loss minus fp32's loss at the same step")
    curve.set_title(f"{result['model']}, {result['optimizer']}, W={result['world_size']}: the same batches", fontsize="medium")
    curve.grid(alpha=0.3)
    legend_below(curve, ncol=1)
    x = list(range(len(rows)))
    acts = [r["saved_activation_bytes"] / 2**10 for r in rows]
    copies = [r["saved_weight_copy_bytes"] / 2**10 for r in rows]
    mem.bar(x, acts, color="#4C72B0", label="activations")
    mem.bar(x, copies, bottom=acts, color="#DD8452", label="16-bit copies of the weights")
    mem.set_xticks(x, [r.get("label", r["precision"]) for r in rows])
    mem.set_ylabel("KiB saved for backward, per rank")
    mem.set_title(f"one forward pass, {result['batch_per_rank']} samples (held in fp32 by every run: "
                  f"{human_bytes(rows[0]['state_bytes'])})", fontsize="medium")
    mem.grid(axis="y", alpha=0.3)
    mem.legend(fontsize="small")
    fig.tight_layout()
    return fig


def render_precision_drift(result: dict) -> None:
    print(f"ddp on {result['world_size']} ranks ({result['backend']}, {result['device']}), {result['steps']} steps of "
          f"{result['optimizer']}; the fp32 run is {result['fp32_vs_single']:.1e} from one process "
          f"(tolerance {result['tolerance']:.0e})")
    table(["precision", "final loss", "max |dθ| vs fp32", "drift / distance trained", "skipped steps",
           "held", "saved activations", "saved weight copies", "step ms: median (interval)"],
          [[r.get("label", r["precision"]), f"{r['final_loss']:.4f}", f"{r['max_abs_diff_vs_fp32']:.1e}",
            f"{r['relative_drift']:.2%}",
            r["skipped_steps"], human_bytes(r["state_bytes"]), human_bytes(r["saved_activation_bytes"]),
            human_bytes(r["saved_weight_copy_bytes"]), step_ms(r)] for r in result["rows"]])
    print("step: the median of the timed steps, which the three precisions took in turn, and the interval of that "
          "median (dpteach.measure)")
    if result.get("sixteen_bit"):
        print(f"16-bit on this machine: {result['sixteen_bit']['sentence']}")
    show(plot_precision_drift(result))


def plot_loss_scaling(result: dict):
    """The loss scale step by step, skipped steps marked; and the losses of the three runs."""
    import matplotlib.pyplot as plt
    fig, (scale, curve) = plt.subplots(1, 2, figsize=(12, 4.2))
    for color, (name, run) in zip(RUN_COLORS, result["runs"].items()):
        steps = range(1, len(run["losses"]) + 1)
        curve.plot(steps, run["losses"], color=color, label=f"{name} (skipped {sum(run['skipped'])})")
        if not run["scales"]:
            continue
        scale.step(steps, [math.log2(s) for s in run["scales"]], where="mid", color=color, label=name)
        skipped = [(i + 1, math.log2(s)) for i, (s, skip) in enumerate(zip(run["scales"], run["skipped"])) if skip]
        if skipped:
            scale.scatter(*zip(*skipped), marker="x", color="black", zorder=3,
                          label="skipped: an inf or NaN gradient" if color == RUN_COLORS[0] else None)
    scale.set_xlabel("step")
    scale.set_ylabel("log2 of the loss scale")
    scale.set_title(f"fp16: start at 2^{math.log2(result['init_scale']):g}, x2 after "
                    f"{result['growth_interval']} clean steps, x0.5 on overflow")
    scale.grid(alpha=0.3)
    scale.legend(fontsize="small")
    curve.set_xlabel("step")
    curve.set_ylabel("training loss (mean over ranks)")
    curve.set_title(f"{result['model']}, SGD, clipped to norm {result['clip_norm']:g}")
    curve.grid(alpha=0.3)
    curve.legend(fontsize="small")
    fig.tight_layout()
    return fig


def render_loss_scaling(result: dict) -> None:
    rows = []
    for name, run in result["runs"].items():
        clean = [n for n, skip in zip(run["grad_norms"], run["skipped"] or [False] * len(run["grad_norms"]))
                 if not skip and math.isfinite(n)]
        rows.append([name, sum(run["skipped"]), f"{min(run['scales']):g}" if run["scales"] else "-",
                     f"{sum(clean) / len(clean):.3g}" if clean else "-", f"{run['losses'][-1]:.4f}",
                     f"{run['moved']:.3g}", "yes" if run["replicas_identical"] else "no"])
    table(["run", "skipped steps", "smallest scale", "mean norm clipping saw", "final loss", "weights moved",
           "replicas equal"], rows)
    show(plot_loss_scaling(result))


def plot_comm_precision(result: dict):
    import matplotlib.pyplot as plt
    rows = result["rows"]
    fig, (sent, drift) = plt.subplots(1, 2, figsize=(12, 3.8))
    names = [r["grad_comm"] for r in rows]
    colors = [PRECISION_COLORS[n] for n in names]
    sent.bar(names, [r["bytes_per_step"] / 2**20 for r in rows], color=colors)
    for i, r in enumerate(rows):
        sent.annotate(human_bytes(r["bytes_per_step"]), (i, r["bytes_per_step"] / 2**20), ha="center", va="bottom",
                      fontsize="small")
    sent.set_ylabel("MiB a rank sends per step")
    sent.set_title(f"DDP's gradients on the wire, {result['model']}, W={result['world_size']}")
    sent.grid(axis="y", alpha=0.3)
    drift.bar(names, [r["relative_drift"] * 100 for r in rows], color=colors)
    drift.set_ylabel("distance from the fp32 run, % of the distance trained")
    drift.set_title(f"after {result['steps']} steps of {result['optimizer']}")
    drift.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def render_comm_precision(result: dict) -> None:
    table(["gradients sent in", "bytes / step", "vs fp32", "max |dθ| vs fp32", "drift / distance trained",
           "final loss", "replicas equal"],
          [[r["grad_comm"], human_bytes(r["bytes_per_step"]), f"{r['bytes_vs_fp32']:.2f}",
            f"{r['max_abs_diff_vs_fp32']:.1e}", f"{r['relative_drift']:.2%}", f"{r['final_loss']:.4f}",
            "yes" if r["replicas_identical"] else "no"] for r in result["rows"]])
    show(plot_comm_precision(result))


# -- the lesson's prediction (prediction.py shows and scores it): lesson 12: what bf16 saves on the wire -----------

def _bf16_saving_percent(result: dict) -> float | None:
    row = next((r for r in result.get("rows", []) if r["grad_comm"] == "bf16"), None)
    return 100 * (1 - row["bytes_vs_fp32"]) if row else None


def _explain_bf16(result: dict, predicted: float) -> str:
    rows = {r["grad_comm"]: r for r in result["rows"]}
    fp32, bf16 = rows["fp32"]["bytes_per_step"], rows["bf16"]["bytes_per_step"]
    return (f"Each gradient element travels in 2 bytes instead of 4, and the ring sends the same 2(W-1)/W of the "
            f"buffer whatever its dtype: {human_bytes(fp32)} per step per rank in fp32, {human_bytes(bf16)} in bf16. "
            f"What it does not save: the optimizer still steps on fp32 gradients, so memory and compute stay, and "
            f"the time saved is the bandwidth part of each message only (the latency part is per message).")


BF16_SAVING = Prediction(
    key="12-bf16-bytes-saved", lesson="12", unit="%",
    question=("What share of the bytes that fp32 gradients put on the wire each step does <b>sending them in "
              "bf16</b> save, in percent?"),
    measure=_bf16_saving_percent, explain=_explain_bf16)
