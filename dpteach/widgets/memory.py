"""Plots and tables for lesson 01: the gradient identity, bitwise reproducibility, and the memory one replica needs."""
from __future__ import annotations

from .rendering import legend_beside, show, table


PART_COLORS = {"params": "#4C72B0", "grads": "#55A868", "optimizer": "#DD8452"}
PART_LABELS = {"params": "parameters", "grads": "gradients", "optimizer": "optimizer state"}


def plot_equivalence(result: dict):
    """Relative distance from the global-batch gradient: each rank's own gradient, then the average."""
    import matplotlib.pyplot as plt
    labels = [f"rank {r} alone" for r in range(result["world_size"])] + ["average of all ranks"]
    values = result["local_rel_errors"] + [result["rel_error"]]
    colors = ["#C44E52"] * result["world_size"] + ["#55A868"]
    fig, ax = plt.subplots(figsize=(9, 3.8))
    floor = 1e-12  # an exact zero cannot be drawn on a log axis
    ax.barh(labels, [max(v, floor) for v in values], color=colors)
    ax.axvline(result["tolerance"], color="black", linestyle="--", label=f"tolerance {result['tolerance']:g}")
    ax.set_xscale("log")
    ax.set_xlabel("|gradient - global-batch gradient| / |global-batch gradient|  (log scale)")
    ax.set_title(f"{result['model']}: W={result['world_size']} ranks x B={result['batch_per_rank']}"
                 f" x K={result['accum_steps']} = global batch {result['global_batch']}")
    ax.invert_yaxis()
    legend_beside(ax)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def render_equivalence(result: dict) -> None:
    table(["gradient", "relative error", "note"],
          [[f"rank {r}'s own gradient", f"{e:.3g}", f"{result['batch_per_rank'] * result['accum_steps']} samples"]
           for r, e in enumerate(result["local_rel_errors"])]
          + [["average over ranks", f"{result['rel_error']:.3g}", "one all-reduce"]])
    print(f"\nmax |averaged - single process| = {result['max_abs_diff']:.3g} over {result['num_params']:,} "
          f"gradient entries; |g| = {result['norm_single']:.4f} (single) vs {result['norm_averaged']:.4f} (averaged)")
    show(plot_equivalence(result))


def render_determinism(result: dict) -> None:
    """Each strategy against each single-process reference: how many weights differ, and by how much."""
    table(["strategy", "reference", "max |dtheta|", "weights that differ", "bit for bit", "replicas identical"],
          [[r["strategy"], r["reference"], f"{r['max_abs_diff']:.3g}",
            f"{r['differing']:,} of {result['num_params']:,}", "yes" if r["bitwise_equal"] else "no",
            "yes" if r["replicas_identical"] else "no"] for r in result["rows"]])


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f}" if n >= 1e8 else f"{n / 1e9:.3f}"


def plot_memory(result: dict):
    """Stacked bars: bytes per rank at ZeRO stages 0-3, against the GPU's capacity."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 4))
    stages = result["by_stage"]
    labels = ["0: plain DP", "1: shard optimizer", "2: + gradients", "3: + parameters"]
    bottom = [0.0] * len(stages)
    for part in ("params", "grads", "optimizer"):
        values = [s[part] / 1e9 for s in stages]
        ax.bar(labels, values, bottom=bottom, color=PART_COLORS[part], label=PART_LABELS[part])
        bottom = [b + v for b, v in zip(bottom, values)]
    for i, s in enumerate(stages):
        ax.annotate(f"{s['total'] / 1e9:,.1f} GB", (i, s["total"] / 1e9), ha="center", va="bottom",
                    fontsize="small", fontweight="bold" if i == result["zero_stage"] else "normal")
    ax.axhline(result["gpu_gb"], color="black", linestyle="--", label=f"GPU memory ({result['gpu_gb']:g} GB)")
    ax.get_xticklabels()[result["zero_stage"]].set_fontweight("bold")
    ax.set_ylabel("memory per GPU (GB)")
    ax.set_xlabel("ZeRO stage (Rajbhandari et al. 2020)")
    ax.set_title(f"{result['params_billion']:g}B parameters, {result['optimizer']}, {result['precision']} "
                 f"precision, W={result['world_size']} (activations not included)")
    ax.set_ylim(0, max(max(bottom), result["gpu_gb"]) * 1.15)
    legend_beside(ax)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def render_memory(result: dict) -> None:
    b = result["bytes_per_param"]
    print(f"bytes per parameter: {b['params']} (parameters) + {b['grads']} (gradients) + "
          f"{b['optimizer']} (optimizer state) = {b['total']}")
    table(["ZeRO stage", "params GB", "grads GB", "optimizer GB", "total GB", f"fits {result['gpu_gb']:g} GB?",
           "largest model that fits", "sent per rank per step, GB"],
          [[s["stage"], _gb(s["params"]), _gb(s["grads"]), _gb(s["optimizer"]), _gb(s["total"]),
            "yes" if s["fits"] else "NO", f"{result['max_params_billion'][s['stage']]:,.1f} B params",
            _gb(s["traffic_bytes"])]
           for s in result["by_stage"]])
    show(plot_memory(result))


def render_measured(rows: list[dict]) -> None:
    """The measured bytes of the course's models next to the table's prediction; on a GPU, also the most
    the CUDA allocator held during the step (the counted tensors plus activations and workspaces)."""
    gpu = any(r.get("allocator_peak_bytes") for r in rows)
    table(["model", "optimizer", "parameters", "param bytes", "grad bytes", "state bytes", "other state",
           "predicted state"] + (["allocator peak (MiB)"] if gpu else []),
          [[r["model"], r["optimizer"], f"{r['num_params']:,}", f"{r['param_bytes']:,}", f"{r['grad_bytes']:,}",
            f"{r['state_bytes']:,}", f"{r['other_state_bytes']:,}", f"{r['predicted']['optimizer']:,}"]
           + ([f"{(r.get('allocator_peak_bytes') or 0) / 2**20:,.0f}"] if gpu else []) for r in rows])
    if gpu:
        print(f"measured on {rows[0]['device']}: the allocator's peak is what the GPU had to hold at once - the "
              f"parameters, gradients and optimizer state above, and also the activations of the batch and "
              f"the kernels' workspaces, which no count of the model's tensors includes")
