"""Plots and tables for lesson 00 (this machine). The helpers every lesson shares live in ``rendering.py``
(re-exported here, where the notebooks have always imported them from).

Helpers take the plain data an experiment returned and draw it; they compute nothing that a
check cell would need (the numbers all come from the experiment's result).
"""
from __future__ import annotations

import numpy as np

from ..network import costmodel
from ..network.link import resolve_link
from .rendering import dress, human_bytes, log_axis, show, size_axis, table


ALGO_STYLE = {"builtin": ("#4C72B0", "o"), "ring": ("#DD8452", "s"), "tree": ("#55A868", "^"),
              "naive": ("#C44E52", "D")}


def plot_profile(result: dict):
    """Left: measured all-reduce time per size (points) and the ring's alpha-beta fit (line).
    Right: bus bandwidth per size, the number nccl-tests reports."""
    import matplotlib.pyplot as plt
    sizes, world = result["sizes"], result["world_size"]
    fit = result["fit"]
    fitted = resolve_link(fit, "fit")
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    algorithms = sorted({r["algorithm"] for r in result["rows"]}, key=list(ALGO_STYLE).index)
    for algorithm in algorithms:
        color, marker = ALGO_STYLE.get(algorithm, ("#777777", "o"))
        rows = sorted((r for r in result["rows"] if r["algorithm"] == algorithm), key=lambda r: r["bytes"])
        left.plot([r["bytes"] for r in rows], [r["time_s"] * 1e3 for r in rows], marker, color=color,
                  label=f"{algorithm} (measured)")
        right.plot([r["bytes"] for r in rows], [r["busbw_GBps"] for r in rows], marker + "-", color=color,
                   label=algorithm)
    dense = np.geomspace(sizes[0], sizes[-1], 100)
    left.plot(dense, [costmodel.predict("ring", float(round(n)), world, fitted) * 1e3 for n in dense], "-",
              color=ALGO_STYLE["ring"][0],
              label=f"ring fit: alpha={fit['alpha_s'] * 1e6:.0f} us, {fit['bandwidth_GBps']:.2f} GB/s")
    log_axis(left)
    left.set_ylabel("all-reduce time (ms, log scale)")
    left.set_title(f"All-reduce time, {world} ranks ({result['backend']})")
    right.set_ylabel("bus bandwidth (GB/s)")
    right.set_title("Bus bandwidth = size / time x 2(W-1)/W")
    for ax in (left, right):
        size_axis(ax, sizes)
        dress(ax, "message size per rank", legend="below")
    fig.tight_layout()
    return fig


def render_profile(result: dict) -> None:
    """What the panel shows after a run: the machine, the sweep as a table, then the plot."""
    m = result["machine"]
    gpus = ", ".join(m["gpus"]) if m["gpus"] else "none"
    print(f"python {m['python']}, torch {m['torch']}, CUDA {m['cuda'] or 'none'}")
    built = ", ".join(name for name in ("gloo", "nccl") if m[name]) or "neither gloo nor nccl"
    print(f"CPU cores: {m['cpus']}   GPUs: {gpus}   backends this torch can use: {built}")
    print(f"{result['world_size']} ranks use backend {result['backend']} on {result['device']}")
    if m.get("gpu_link"):  # what the GPU lessons will show here; `dpteach doctor` has it lesson by lesson
        print(f"between the GPUs: {m['gpu_link']}\nlesson 12's 16-bit format: {m['sixteen_bit']}")
    print()
    rows = sorted(result["rows"], key=lambda r: (r["bytes"], r["algorithm"]))
    table(["size", "algorithm", "time (ms)", "algbw (MB/s)", "busbw (MB/s)"],
          [[human_bytes(r["bytes"]), r["algorithm"], f"{r['time_s'] * 1e3:.3f}", f"{r['algbw_GBps'] * 1e3:,.1f}",
            f"{r['busbw_GBps'] * 1e3:,.1f}"] for r in rows])  # MB/s: a 4 KiB message's rate reads as 0.000 in GB/s
    fit = result["fit"]
    print(f"\nring fit: alpha = {fit['alpha_s'] * 1e6:.1f} us per message, beta = {fit['beta_s_per_byte'] * 1e9:.3f} "
          f"ns/byte ({fit['bandwidth_GBps']:.2f} GB/s), R^2 = {fit['r2']:.3f}")
    show(plot_profile(result))
