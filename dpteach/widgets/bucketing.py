"""Plots and tables for lesson 03: bucket assignments and the bucket-size sweep."""
from __future__ import annotations

from .start import show, table


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
    ax.set_xlabel("bucket size (MiB of float32 gradients)")
    ax.set_title(f"{model}: {len(buckets)} buckets at bucket_mb={bucket_mb:g} (launch order, top first)")
    ax.legend(loc="lower right", fontsize="small")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def render_assignment(plan: dict) -> None:
    print(f"{plan['model']}: {plan['num_tensors']} gradient tensors, {plan['grad_bytes'] / 2**20:.2f} MiB; "
          f"model order: {', '.join(plan['parameters'])}\n")
    table(["bucket", "parameters (last layer first)", "MiB"],
          [[b["index"], ", ".join(b["params"]), f"{b['bytes'] / 2**20:.3f}"] for b in plan["buckets"]])
    show(plot_assignment(plan))


def plot_sweep(result: dict):
    """Per configuration: measured step time, measured all-reduce time, predicted all-reduce time."""
    import matplotlib.pyplot as plt
    rows = [r for r in result["rows"] if r["strategy"] != "local"]
    labels = [f"{r['label']}\n{r['messages_per_step']} msg" for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(9.5, 4.5))
    ax.plot(x, [r["step_time_s"] * 1e3 for r in rows], "o-", color="#4C72B0", label="step time (measured)")
    ax.plot(x, [r["comm_s"] * 1e3 for r in rows], "s-", color="#DD8452", label="time in all-reduces (measured)")
    ax.plot(x, [r["predicted_comm_s"] * 1e3 for r in rows], "^--", color="#DD8452", alpha=0.7,
            label="all-reduces predicted: messages x 2(W-1)alpha + bytes x beta")
    ax.plot(x, [r["predicted_latency_s"] * 1e3 for r in rows], "v:", color="#C44E52",
            label="of which latency: messages x 2(W-1)alpha")
    ax.axhline(result["local_step_s"] * 1e3, color="grey", linestyle="--", label="local step (no communication)")
    ax.set_xticks(list(x), labels)
    ax.set_xlabel("per-parameter (naive), then bucketed with growing bucket_mb")
    ax.set_ylabel("milliseconds per step")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{result['model']}, W={result['world_size']} ({result['backend']}), {result['num_tensors']} "
                 f"gradient tensors, {result['grad_bytes'] / 2**20:.1f} MiB")
    ax.legend(fontsize="small", loc="upper right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def render_sweep(result: dict) -> None:
    print(f"measured in the same world: alpha = {result['alpha_s'] * 1e6:.0f} us per message, so each all-reduce "
          f"pays about {result['latency_per_allreduce_s'] * 1e3:.2f} ms of latency at W={result['world_size']}\n")
    table(["configuration", "messages/step", "step (ms)", "in all-reduce (ms)", "predicted latency (ms)",
           "MB on wire/step", "max|dtheta| vs naive"],
          [[r["label"], r["messages_per_step"], f"{r['step_time_s'] * 1e3:.1f}", f"{r['comm_s'] * 1e3:.1f}",
            f"{r['predicted_latency_s'] * 1e3:.2f}", f"{r['bytes_per_step'] / 1e6:.2f}",
            "-" if r["max_abs_diff_vs_naive"] is None else f"{r['max_abs_diff_vs_naive']:.1g}"]
           for r in result["rows"]])
    show(plot_sweep(result))
