"""Tables and plots for lesson 15: activation memory and checkpointing, the learning-rate rules, the critical batch
size, and lesson 09's scaling judged by time to a target loss."""
from __future__ import annotations

import math

from ..training.batch_rules import run_outcome
from ..training.target import smoothed
from .rendering import dress, human_bytes, legend_below, log_axis, show, table

RULE_COLOURS = {"fixed": "#8C8C8C", "linear": "#4C72B0", "sqrt": "#DD8452"}


def _steps(value) -> str:
    return "not reached" if value is None else str(value)


def _label(row: dict) -> str:
    warm = f", warmup {row['warmup_steps']}" if row["warmup_steps"] else ""
    return f"B={row['batch']}: {row['rule']}{warm}"


def render_activation_memory(result: dict) -> None:
    """Per model: activations per sample and at the measured batch beside the model states, and the micro-batch
    that fits the chosen memory with and without checkpointing."""
    table(["model", "parameters", f"model states (fp32, {result['optimizer']})", "activations per sample",
           "activations at batch", "batch", f"largest micro-batch in {result['memory_gb']:g} GB", "checkpointed"],
          [[r["model"], f"{r['num_params']:,}", human_bytes(r["state_bytes"]), human_bytes(r["per_sample_bytes"]),
            human_bytes(r["saved_bytes"]), r["batch"], f"{r['largest_micro_batch']:,}" if r["largest_micro_batch"]
            else f"0: {r['why']}", f"{r['largest_micro_batch_checkpointed']:,}"] for r in result["rows"]])
    show(plot_activation_memory(result))


def plot_activation_memory(result: dict):
    import matplotlib.pyplot as plt
    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(8, 1.6 + 0.7 * len(rows)))
    names = [r["model"] for r in rows]
    y = range(len(rows))
    ax.barh([i - 0.2 for i in y], [r["state_bytes"] for r in rows], height=0.4, color="#8C8C8C",
            label=f"model states (fp32, {result['optimizer']})")
    ax.barh([i + 0.2 for i in y], [r["saved_bytes"] for r in rows], height=0.4, color="#4C72B0",
            label="activations kept for backward, at the batch of the table")
    ax.barh([i + 0.2 for i in y], [r["checkpointed_saved_bytes"] for r in rows], height=0.4, color="#55A868",
            label="... with every block checkpointed")
    ax.set_yticks(list(y), names)
    ax.invert_yaxis()
    ax.set_xscale("log")
    dress(ax, "bytes per rank (log scale)", None, "What one rank holds: the model, and its micro-batch's activations",
          grid="x", legend="below", title_size="medium")
    fig.tight_layout()
    return fig


def render_checkpointing(result: dict) -> None:
    """Bytes kept for backward and the whole step's time, without and with checkpointing every block."""
    table(["model", "blocks", "kept for backward", "checkpointed", "saved", "peak in backward (checkpointed)",
           "step", "step checkpointed", "ratio", "one more forward predicts"],
          [[r["model"], r["blocks"], human_bytes(r["saved_bytes"]), human_bytes(r["checkpointed_saved_bytes"]),
            f"{r['share_saved']:.0%}", human_bytes(r["checkpointed_peak_bytes"]), f"{r['plain_step_s'] * 1e3:.1f} ms",
            f"{r['checkpointed_step_s'] * 1e3:.1f} ms", f"{r['step_time_ratio']:.2f}x", f"{r['predicted_ratio']:.2f}x"]
           for r in result["rows"]])
    show(plot_checkpointing(result))


def plot_checkpointing(result: dict):
    import matplotlib.pyplot as plt
    rows = result["rows"]
    fig, (memory, time) = plt.subplots(1, 2, figsize=(11, 3.8))
    x = range(len(rows))
    panels = ((memory, "saved_bytes", "checkpointed_saved_bytes", "MiB kept for backward", 2 ** 20),
              (time, "plain_step_s", "checkpointed_step_s", "ms per training step", 1e-3))
    for ax, plain, ckpt, unit, scale in panels:
        ax.bar([i - 0.2 for i in x], [r[plain] / scale for r in rows], width=0.4, color="#4C72B0", label="plain")
        ax.bar([i + 0.2 for i in x], [r[ckpt] / scale for r in rows], width=0.4, color="#55A868",
               label="every block checkpointed")
    for offset, key in ((-0.2, "plain_step"), (0.2, "checkpointed_step")):  # each median's interval
        if all(key in r for r in rows):
            time.errorbar([i + offset for i in x], [r[key]["median"] * 1e3 for r in rows], fmt="none", ecolor="black",
                          capsize=3, yerr=[[(r[key]["median"] - r[key]["low"]) * 1e3 for r in rows],
                                           [(r[key]["high"] - r[key]["median"]) * 1e3 for r in rows]])
        ax.set_xticks(list(x), [r["model"] for r in rows])
        ax.set_ylabel(unit)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize="small")
    memory.set_title(f"Memory at a micro-batch of {result['batch']}", fontsize="medium")
    time.set_title("Time: forward + backward + optimizer step (median, interval)", fontsize="medium")
    fig.tight_layout()
    return fig


def render_lr_rules(result: dict) -> None:
    """Steps to the target for every batch and rule, and the loss curves against steps and against samples."""
    table(["global batch", "ranks x micro x accum", "rule", "warmup steps", "learning rate", "steps to target",
           "samples to target"],
          [[r["batch"], f"{result['world_size']} x {r['micro_batch']} x {r['accum_steps']}", r["rule"],
            r["warmup_steps"] or "-", f"{r['lr']:.4g}", run_outcome(r),
            "-" if r["samples_to_target"] is None else f"{r['samples_to_target']:,}"] for r in result["rows"]])
    show(plot_lr_rules(result))


def plot_lr_rules(result: dict):
    import matplotlib.pyplot as plt
    fig, (by_step, by_sample) = plt.subplots(1, 2, figsize=(12, 4.6))
    batches = sorted({r["batch"] for r in result["rows"]})
    widths = {b: 0.8 + 1.4 * i / max(1, len(batches) - 1) for i, b in enumerate(batches)}
    top = 1.15 * max(r["losses"][0] for r in result["rows"])
    for row in result["rows"]:
        curve = smoothed(row["losses"], result["window"])
        style = {"color": RULE_COLOURS[row["rule"]], "linewidth": widths[row["batch"]], "label": _label(row),
                 "linestyle": (0, (4, 2)) if row["warmup_steps"] else "-"}
        steps = range(1, len(curve) + 1)
        by_step.plot(steps, curve, **style)
        by_sample.plot([s * row["batch"] for s in steps], curve, **style)
    for ax, name in ((by_step, "optimizer step"), (by_sample, "samples seen (log scale)")):
        ax.axhline(result["target_loss"], color="black", linestyle=":", label="target loss")
        ax.set_ylim(0.9 * min(result["target_loss"], min(min(r["losses"]) for r in result["rows"])), top)
        ax.set_xlabel(name)
        ax.grid(alpha=0.3)
    log_axis(by_sample, "x")  # 100, 200, 500, 1000, ... rather than 10^2, 10^3
    by_step.set_ylabel(f"training loss (mean of the last {result['window']} steps)")
    by_step.set_title(f"Per step: base lr {result['base_lr']:g} at B={result['base_batch']}", fontsize="medium")
    by_sample.set_title("Per sample: what each step's batch cost", fontsize="medium")
    handles, labels = by_step.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize="small", frameon=False)
    rows_of_legend = -(-len(labels) // 4)
    fig.tight_layout(rect=(0, 0.05 * rows_of_legend + 0.02, 1, 1))
    return fig


def render_critical_batch(result: dict) -> None:
    """Per batch the best learning rate and its steps and samples to the target; the fit and the noise scale."""
    fit = result["fit"]
    table(["global batch", "ranks x micro x accum", "best lr", "steps to target", "fit predicts", "off by",
           "samples to target", "B_simple in its run"],
          [[r["batch"], f"{result['world_size']} x {r['micro_batch']} x {r['accum_steps']}",
            "-" if r["best_lr"] is None else f"{r['best_lr']:g}", _steps(r["steps_to_target"]),
            *_predicted(fit, r), "-" if r["samples_to_target"] is None else f"{r['samples_to_target']:,}",
            "-" if r["noise"]["b_simple"] is None else f"{r['noise']['b_simple']:.0f}"] for r in result["rows"]])
    show(plot_critical_batch(result))


def _predicted(fit: dict | None, row: dict) -> list[str]:
    if not fit or row["batch"] not in fit["batches"]:
        return ["-", "-"]
    i = fit["batches"].index(row["batch"])
    p, m = fit["predicted"][i], fit["measured"][i]
    return [f"{p:.1f}", f"{(p - m) / m:+.0%}"]


def plot_critical_batch(result: dict):
    import matplotlib.pyplot as plt
    fig, (steps_ax, samples_ax) = plt.subplots(1, 2, figsize=(12, 5.6))
    rows = [r for r in result["rows"] if r["steps_to_target"]]
    batches = [r["batch"] for r in rows]
    steps_ax.plot(batches, [r["steps_to_target"] for r in rows], "o", color="#4C72B0", label="measured")
    samples_ax.plot(batches, [r["samples_to_target"] for r in rows], "o", color="#4C72B0", label="measured")
    fit, noise = result["fit"], result["noise_scale"]["b_simple"]
    if fit:
        low, high = min(batches) / 1.5, max(batches) * 1.5
        grid = [low * (high / low) ** (i / 60) for i in range(61)]
        steps_ax.plot(grid, [fit["s_min"] * (1 + fit["b_noise"] / b) for b in grid], color="#DD8452",
                      label=f"fit: S_min {fit['s_min']:.1f}, B_noise {fit['b_noise']:.0f}")
        samples_ax.plot(grid, [fit["e_min"] * (1 + b / fit["b_noise"]) for b in grid], color="#DD8452",
                        label=f"fit: E_min {fit['e_min']:,.0f} = S_min x B_noise")
        steps_ax.axhline(fit["s_min"], color="#DD8452", linestyle=":", linewidth=1,
                         label=f"S_min {fit['s_min']:.1f}: the fewest steps, at any batch")
        samples_ax.axhline(fit["e_min"], color="#DD8452", linestyle=":", linewidth=1,
                           label=f"E_min {fit['e_min']:,.0f}: the fewest samples")
    measured = [r["batch"] for r in result["rows"]]
    for ax in (steps_ax, samples_ax):
        if fit and fit["b_noise"]:
            ax.axvline(fit["b_noise"], color="#DD8452", linestyle="--", linewidth=1,
                       label=f"B_crit from the fit: {fit['b_noise']:.0f}")
        if noise:
            ax.axvline(noise, color="#55A868", linestyle="--", linewidth=1, label=f"B_simple measured: {noise:.0f}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(measured, [str(b) for b in measured])  # every measured batch labelled, whatever the target
        _readable_log_y(ax)
        ax.set_xlabel("global batch B (log scale)")
        ax.grid(alpha=0.3, which="both")
        legend_below(ax, ncol=1)
    steps_ax.set_ylabel("steps to the target loss")
    samples_ax.set_ylabel("samples to the target loss")
    steps_ax.set_title("Steps: halve while B << B_noise, then flat at S_min", fontsize="medium")
    samples_ax.set_title("Samples: flat at E_min while B << B_noise, then grow with B", fontsize="medium")
    fig.tight_layout()
    return fig


NICE = (1, 1.5, 2, 3, 4, 5, 6, 8)  # tick mantissas: at least two fall in any range wider than a factor 1.5


def _readable_log_y(ax) -> None:
    """A log y axis labelled with plain numbers at several round values inside its range (20, 30, 40, 60 or
    2,000, 3,000, 5,000): a range narrower than a decade gets no label from matplotlib's decade ticks."""
    ax.set_yscale("log")
    low, high = ax.get_ylim()
    ticks = [m * 10 ** e for e in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1) for m in NICE]
    ticks = [t for t in ticks if low <= t <= high]
    if len(ticks) > 7:  # a wide range: the 1-2-5 steps are enough
        ticks = [t for t in ticks if round(t / 10 ** math.floor(math.log10(t)), 3) in (1, 2, 5)]
    ax.set_yticks(ticks, [f"{t:,.0f}" if t >= 10 else f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.set_ylim(low, high)


def render_time_to_target_scaling(result: dict) -> None:
    """Lesson 09's efficiency in samples per second beside its efficiency in time to the target loss."""
    table(["ranks W", "global batch", "step time", "steps to target", "time to target", "efficiency (samples/s)",
           "steps(1) / (W steps(W)), counted", "efficiency (time to target)"],
          [[r["world_size"], r["global_batch"], f"{r['step_time_s'] * 1e3:.1f} ms", _steps(r["steps_to_target"]),
            "-" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.2f} s",
            _with_interval(r["efficiency"], r.get("efficiency_interval")),
            "-" if r.get("steps_factor") is None else f"{r['steps_factor']:.2f}",
            "-" if r["efficiency_to_target"] is None else
            _with_interval(r["efficiency_to_target"], r.get("efficiency_to_target_interval"))] for r in result["rows"]])
    show(plot_time_to_target_scaling(result))


def _with_interval(value: float, interval) -> str:
    if not interval or interval[0] == interval[1]:
        return f"{value:.0%}"
    return f"{value:.0%} ({interval[0]:.0%}-{interval[1]:.0%})"


def plot_time_to_target_scaling(result: dict):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    rows = result["rows"]
    ws = [r["world_size"] for r in rows]
    ax.plot(ws, [100 * r["efficiency"] for r in rows], "o-", color="#4C72B0", label="samples per second")
    to_target = [(r["world_size"], 100 * r["efficiency_to_target"]) for r in rows if r["efficiency_to_target"]]
    if to_target:
        ax.plot(*zip(*to_target), "s-", color="#C44E52", label="time to the target loss")
    ax.axhline(100, color="black", linewidth=0.8, linestyle=":")
    ax.set_xticks(ws)
    ax.set_xlabel("ranks W (weak scaling: global batch = W x per-rank batch)")
    ax.set_ylabel("scaling efficiency, % of ideal")
    ax.set_ylim(0, max(110, 5 + max(100 * r["efficiency"] for r in rows)))
    crit = result["b_crit"]
    ax.set_title("Efficiency, two ways" + (f" (B_crit from the fit: {crit:.0f})" if crit else ""), fontsize="medium")
    ax.grid(alpha=0.3)
    legend_below(ax, ncol=2)
    fig.tight_layout()
    return fig
