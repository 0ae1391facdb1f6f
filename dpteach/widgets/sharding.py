"""Plots and tables for lesson 11: what each rank holds under ZeRO and FSDP2, when, and what it costs."""
from __future__ import annotations

from ..sync import strategy_class
from .gantt import plot_gantt
from .prediction import Prediction
from .rendering import human_bytes, legend_beside, show, table

STAGE_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52"]


def plot_sharding_memory(result: dict):
    """Per strategy: held at the optimizer step (measured and predicted), peak, and traffic against ddp."""
    import matplotlib.pyplot as plt
    rows = result["rows"]
    names = [strategy_class(r["strategy"]).title() for r in rows]
    fig, (mem, sent) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    x = range(len(rows))
    mem.bar([i - 0.27 for i in x], [r["state_bytes"] / 2**20 for r in rows], 0.27, color="#4C72B0",
            label="held at the optimizer step (measured)")
    mem.bar(list(x), [r["predicted_state_bytes"] / 2**20 for r in rows], 0.27, color="#A1C9F4",
            label="predicted (ZeRO paper's accounting)")
    mem.bar([i + 0.27 for i in x], [r["peak_bytes"] / 2**20 for r in rows], 0.27, color="#DD8452",
            label="peak, with transient buffers (measured)")
    mem.set_xticks(list(x), names, rotation=20, ha="right", fontsize="small")
    mem.set_ylabel("MiB per rank")
    mem.set_title(f"{result['model']}, {result['optimizer']}, W={result['world_size']}: memory per rank")
    mem.set_ylim(0, max(max(r["peak_bytes"], r["state_bytes"]) for r in rows) / 2**20 * 1.5)
    mem.legend(loc="upper right", fontsize="small")  # the sharded bars are low on the right: room above them
    mem.grid(axis="y", alpha=0.3)
    sent.bar(list(x), [r["bytes_vs_ddp"] for r in rows], color="#55A868")
    sent.axhline(1.0, color="black", linewidth=0.8)
    for i, r in enumerate(rows):
        sent.annotate(f"{r['bytes_vs_ddp']:.2f}x", (i, r["bytes_vs_ddp"]), ha="center", va="bottom", fontsize="small")
    sent.set_xticks(list(x), [r["strategy"] for r in rows], fontsize="small")
    sent.set_ylabel("bytes sent per step / ddp's")
    sent.set_title("traffic per step")
    sent.set_ylim(0, max(r["bytes_vs_ddp"] for r in rows) * 1.2)
    sent.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def render_sharding_memory(result: dict) -> None:
    print(f"parameters of the {result['model']}: {result['param_bytes']:,} bytes (fp32); {result['steps']} steps "
          f"of {result['optimizer']} on {result['world_size']} ranks ({result['backend']}, {result['device']})")
    allocator = any(r.get("allocator_peak_bytes") for r in result["rows"])  # GPU ranks: the allocator's own peak
    table(["strategy", "held", "predicted", "held / ddp", "peak", "activations", "sent / step",
           "sent / ddp", "max |dθ| vs 1 process", "replicas equal"] + (["allocator peak"] if allocator else []),
          [[r["strategy"], human_bytes(r["state_bytes"]), human_bytes(r["predicted_state_bytes"]),
            f"{r['state_vs_ddp']:.3f}", human_bytes(r["peak_bytes"]), human_bytes(r["activation_bytes"]),
            human_bytes(r["bytes_per_step"]), f"{r['bytes_vs_ddp']:.2f}",
            f"{r['max_abs_diff_vs_single']:.1e}", "yes" if r["replicas_identical"] else "no"]
           + ([human_bytes(r["allocator_peak_bytes"] or 0)] if allocator else []) for r in result["rows"]])
    print(f"activations: what one forward pass of a rank's micro-batch ({result['batch_per_rank']} samples) keeps for "
          "backward, counted from the saved tensors - on top of the held bytes, the same under every strategy")
    if allocator:
        print("allocator peak: the most each rank's CUDA caching allocator held at once during the run "
              "(torch.cuda.max_memory_allocated) - the counted tensors plus activations, workspaces and FSDP2's "
              "own buffers, which no count of a strategy's tensors sees")
    show(plot_sharding_memory(result))


def render_sharding_timeline(result: dict) -> None:
    import matplotlib.pyplot as plt
    ranks = sorted(result["spans"])
    fig, ax = plt.subplots(figsize=(12, 1.1 * len(ranks) + 1.6))
    plot_gantt({r: result["spans"][r] for r in ranks}, ax=ax, device=result["device"],
               title=f"{result.get('strategy', 'zero3')}, {result['model']}, W={result['world_size']}: step "
                     f"{result['step']} (all-gathers and reduce-scatters in the comm rows)")
    fig.tight_layout()
    show(fig)


def plot_sharding_payoff(result: dict):
    """Memory per GPU of each stage as W grows, against the GPU; and each stage's communication per step."""
    import matplotlib.pyplot as plt
    fig, (mem, comm) = plt.subplots(1, 2, figsize=(12, 4.2))
    for stage in range(4):
        rows = [r for r in result["rows"] if r["stage"] == stage]
        ws = [r["world_size"] for r in rows]
        mem.plot(ws, [r["gb_per_gpu"] for r in rows], marker="o", color=STAGE_COLORS[stage], label=f"stage {stage}")
        comm.plot(ws, [r["comm_s"] * 1e3 for r in rows], marker="o", color=STAGE_COLORS[stage],
                  linestyle="--" if stage in (1, 2) else "-", label=f"stage {stage}")
    mem.axhline(result["gpu_gb"], color="black", linestyle="--", label=f"GPU memory ({result['gpu_gb']:g} GB)")
    for ax in (mem, comm):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ranks W (log scale)")
        ax.grid(alpha=0.3)
    mem.set_yscale("log")
    mem.set_ylabel("GB per GPU (log scale), activations not included")
    mem.set_title(f"{result['params_billion']:g}B parameters, {result['optimizer']}, {result['precision']}")
    comm.set_ylabel("collectives per step (ms)")
    comm.set_title(f"on {result['link']['name']}: stages 0-2 level, stage 3 x1.5")
    legend_beside(comm)
    mem.legend(fontsize="small", loc="lower left")
    fig.tight_layout()
    return fig


def render_sharding_payoff(result: dict) -> None:
    by_w = {}
    for r in result["rows"]:
        by_w.setdefault(r["world_size"], {})[r["stage"]] = r
    def duration(seconds: float) -> str:  # a time people read: ms up to a second, then s, then min
        if seconds < 1:
            return f"{seconds * 1e3:.1f} ms"
        return f"{seconds:,.1f} s" if seconds < 120 else f"{seconds / 60:,.0f} min"
    table(["W"] + [f"stage {s} GB" for s in range(4)] + ["smallest stage that fits", "its comm per step"],
          [[w] + [f"{stages[s]['gb_per_gpu']:,.1f}" for s in range(4)]
           + ([next(f"stage {s}" for s in range(4) if stages[s]["fits"]),
               duration(next(stages[s]["comm_s"] for s in range(4) if stages[s]["fits"]))]
              if any(stages[s]["fits"] for s in range(4)) else ["none", "-"])
           for w, stages in by_w.items()])
    show(plot_sharding_payoff(result))


# -- the lesson's prediction (prediction.py shows and scores it): lesson 11: what ZeRO-2 leaves on a rank ----------

def _zero2_factor(result: dict) -> float | None:
    row = next((r for r in result.get("rows", []) if r["strategy"] == "zero2"), None)
    return row["state_bytes"] / result["param_bytes"] if row else None


def _explain_zero2(result: dict, predicted: float) -> str:
    row = next(r for r in result["rows"] if r["strategy"] == "zero2")
    rule = row["predicted_state_bytes"] / result["param_bytes"]
    return (f"The ZeRO paper's rule gives <b>{rule:.3g} P</b> for {result['optimizer']} at W={result['world_size']}: the "
            f"parameters whole on every rank (P), the gradients and the optimizer's state cut in W shards. The "
            f"measured {human_bytes(row['state_bytes'])} differs from the rule only by padding: each flat buffer is "
            f"rounded up so that every rank's shard has the same length.")


ZERO2_STATE = Prediction(
    key="11-zero2-state-per-rank", lesson="11", unit="x P",
    question=("How many bytes does <b>one rank hold under ZeRO-2</b> when its optimizer steps (parameters, gradients "
              "and optimizer state), as a multiple of the model's parameter bytes P, with the panel's W and optimizer? "
              "(Adam keeps two moments per parameter; plain SGD none.)"),
    measure=_zero2_factor, explain=_explain_zero2)
