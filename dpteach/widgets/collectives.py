"""Plots and widgets for lesson 02: the collectives, a step-by-step trace player, the alpha-beta model."""
from __future__ import annotations

import numpy as np

from ..measure import ranking, spread
from ..network import costmodel
from ..network.link import resolve_link
from .capture import write_into
from .prediction import Prediction
from .rendering import human_bytes, legend_beside, log_axis, show, size_axis, table
from .start import ALGO_STYLE


def render_basics(result: dict) -> None:
    """One small table per collective: what each rank held before and after."""
    def fmt(values):
        return "-" if not values else "[" + ", ".join(f"{v:g}" for v in values) + "]"
    for op, per_rank in result["ops"].items():
        table(["rank", "before", "after"], [[r, fmt(x["before"]), fmt(x["after"])] for r, x in enumerate(per_rank)],
              title=f"\n{op}")


def _label(ranks: frozenset, world: int) -> str:
    return "+".join(str(r) for r in sorted(ranks))


def draw_frame(result: dict, index: int, ax) -> None:
    """Draw every rank's buffer after step ``index`` of the replayed trace, and that step's transfers.

    Rows are ranks, columns are elements (grouped into the ring's chunks). A cell's colour is the
    number of ranks whose contribution it holds; its text names them. Arrows are the messages of
    this step, from the sender's row to the receiver's, over the elements they carry.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    world, numel = result["world_size"], result["numel"]
    frame = result["frames"][index]
    cmap = plt.get_cmap("Blues")
    received = {(t["dst"], i) for t in frame["transfers"] for i in range(t["start"], t["stop"])}
    for r in range(world):
        for i in range(numel):
            held = frame["state"][r][i]
            shade = 0.15 + 0.75 * (len(held) - 1) / max(1, world - 1)
            edge = "#DD8452" if (r, i) in received else "white"
            ax.add_patch(Rectangle((i, r), 1, 1, facecolor=cmap(shade), edgecolor=edge,
                                   linewidth=3 if (r, i) in received else 1))
            ax.text(i + 0.5, r + 0.5, _label(held, world), ha="center", va="center", fontsize=8,
                    color="white" if shade > 0.55 else "black")
    for start, stop in result["chunks"][1:]:
        ax.axvline(start, color="black", linewidth=1.5)
    for t in frame["transfers"]:
        x = (t["start"] + t["stop"]) / 2
        bend = 0.35 if t["dst"] > t["src"] else -0.35
        ax.annotate("", xy=(x, t["dst"] + 0.5), xytext=(x, t["src"] + 0.5),
                    arrowprops={"arrowstyle": "-|>", "color": "#C44E52", "lw": 2,
                                "connectionstyle": f"arc3,rad={bend}"})
    ax.set_xlim(0, numel)
    ax.set_ylim(world, 0)
    ax.set_yticks([r + 0.5 for r in range(world)], [f"rank {r}" for r in range(world)])
    ax.set_xticks([(a + b) / 2 for a, b in result["chunks"]], [f"chunk {c}" for c in range(len(result["chunks"]))])
    ax.tick_params(length=0)
    total = len(result["frames"]) - 1
    if frame["phase"] == "start":
        title = f"{result['algorithm']} all-reduce, W={world}: before any message (rank r holds only its own data)"
    else:
        moves = ", ".join(f"{t['src']}->{t['dst']}" for t in frame["transfers"])
        title = (f"{result['algorithm']}, step {index} of {total} ({frame['phase'].replace('_', '-')}): "
                 f"{moves}")
    ax.set_title(title, fontsize="medium")
    ax.set_xlabel("elements of the buffer; cell text = the ranks whose values it has summed")


def trace_player(result: dict):
    """A Play button and a slider over the steps of a recorded trace; the figure redraws on each move."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    last = len(result["frames"]) - 1
    play = widgets.Play(value=0, min=0, max=last, interval=1200, description="play")
    slider = widgets.IntSlider(value=0, min=0, max=last, description="step")
    widgets.jslink((play, "value"), (slider, "value"))

    out = widgets.Output()

    def draw(step):
        with write_into(out):  # written by the kernel, not routed by the front end: see capture.py
            fig, ax = plt.subplots(figsize=(9, 0.7 * result["world_size"] + 1.8))
            draw_frame(result, step, ax)
            fig.tight_layout()
            show(fig)

    draw(slider.value)
    slider.observe(lambda change: draw(change["new"]), names="value")
    return widgets.VBox([widgets.HBox([play, slider]), out])


def per_rank(values) -> str:
    """``[6, 6, 6, 6]`` as prose: "6 each", or "3, 0, 0 and 3"."""
    values = [f"{v:g}" for v in values]
    if len(set(values)) == 1:
        return f"{values[0]} each"
    return ", ".join(values[:-1]) + " and " + values[-1]


def render_trace(result: dict) -> None:
    from IPython.display import display
    print(f"{result['algorithm']}: {len(result['frames']) - 1} steps; messages sent by ranks 0, 1, ...: "
          f"{per_rank(result['messages_sent'])}; elements sent: {per_rank(result['elements_sent'])} (of "
          f"{result['numel']} per rank); the replay {'matches' if result['replay_matches_run'] else 'does NOT match'} "
          f"the real buffers")
    display(trace_player(result))


def plot_sweep(result: dict):
    """Measured all-reduce times (points) against the alpha-beta predictions from one ring fit (lines)."""
    import matplotlib.pyplot as plt
    sizes, world, fit = result["sizes"], result["world_size"], result["fit"]
    fitted = resolve_link(fit, "fit")
    fig, ax = plt.subplots(figsize=(9, 4.5))
    dense = np.geomspace(sizes[0], sizes[-1], 100)
    for algorithm, times in result["measured"].items():
        color, marker = ALGO_STYLE.get(algorithm, ("#777777", "o"))
        spreads = result.get("spreads", {}).get(algorithm)
        yerr = None if spreads is None else [[(t - s["low"]) * 1e3 for t, s in zip(times, spreads)],
                                              [(s["high"] - t) * 1e3 for t, s in zip(times, spreads)]]
        ax.errorbar(sizes, [t * 1e3 for t in times], yerr=yerr, fmt=marker, color=color, markersize=7, capsize=3,
                    label=f"{algorithm} measured")
        if algorithm in result["predicted"]:
            ax.plot(dense, [costmodel.predict(algorithm, float(round(n)), world, fitted) * 1e3 for n in dense],
                    "-", color=color, alpha=0.8, label=f"{algorithm} predicted")
    if result["crossover_bytes"] and sizes[0] <= result["crossover_bytes"] <= sizes[-1]:
        ax.axvline(result["crossover_bytes"], color="grey", linestyle=":",
                   label=f"model: tree = ring at {human_bytes(result['crossover_bytes'])}")
    size_axis(ax, sizes)
    log_axis(ax)
    ax.set_xlabel("message size per rank")
    ax.set_ylabel("all-reduce time (ms, log scale)\nmedian, bars: interval of the rounds")
    ax.set_title(f"W={world} ({result['backend']}): one fit to the ring, alpha={fit['alpha_s'] * 1e6:.0f} us, "
                 f"{fit['bandwidth_GBps']:.2f} GB/s")
    legend_beside(ax)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def oversubscription_note(result: dict) -> str | None:
    """The caveat that comes first when a CPU run put more ranks than cores on this machine."""
    world, cores = result["world_size"], result.get("cores") or 1
    if result.get("device") != "cpu" or world <= cores:
        return None
    return (f"This run put W={world} ranks on {cores} CPU cores, so the ranks took turns on the cores: every "
            f"step of an algorithm also waited for the operating system to run the next rank, and an algorithm "
            f"with fewer steps in sequence gains from that, whatever the network would do.")


def _ms(result: dict, algorithm: str, i: int) -> str:
    s = result["spreads"][algorithm][i]
    return f"{s['median'] * 1e3:.2f} ({s['low'] * 1e3:.2f}-{s['high'] * 1e3:.2f})"


def fastest_at(result: dict, i: int) -> str:
    """The algorithm faster than every other at size ``i`` beyond the noise, or the ones within noise of the first."""
    if result["measured_fastest"][i] is not None:
        return result["measured_fastest"][i]
    spreads = {a: spread(result["spreads"][a][i]["samples"]) for a in result["measured"]}
    return "tie: " + ", ".join(ranking(spreads).leaders)


def render_sweep(result: dict) -> None:
    note = oversubscription_note(result)
    if note:
        print(note)
    ring_vs_tree = [w or "within noise" for w in result["measured_winner"]] if result["measured_winner"] \
        else ["-"] * len(result["sizes"])
    print(f"Each time: the median of {result['iters']} interleaved rounds, and in brackets the interval of that median "
          f"(dpteach.measure); an algorithm is named faster only where its whole interval lies below the others'.")
    table(["size"] + [f"{a} (ms)" for a in result["measured"]]
          + ["model picks (ring/tree)", "measured: ring or tree", "measured fastest of all"],
          [[human_bytes(n)] + [_ms(result, a, i) for a in result["measured"]]
           + [result["model_choice"][i], ring_vs_tree[i], fastest_at(result, i)]
           for i, n in enumerate(result["sizes"])])
    table(["algorithm", "own fit: alpha (us/message)", "bandwidth (GB/s)", "R^2"],
          [[a, f"{f['alpha_s'] * 1e6:.0f}", f"{f['bandwidth_GBps']:.2f}", f"{f['r2']:.3f}"]
           for a, f in result["fits"].items()], title="\neach algorithm fitted on its own (its own formula):")
    show(plot_sweep(result))


def plot_crossover(links: dict, world_sizes=(4, 8, 16, 64, 256, 1024, 4096)):
    """Below the line the tree is predicted faster, above it the ring: per link, as W grows."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 4))
    for name, link in links.items():
        points = [(p, costmodel.crossover_bytes(p, link)) for p in world_sizes]
        points = [(p, n) for p, n in points if n]
        ax.plot([p for p, _ in points], [n for _, n in points], "o-", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(world_sizes), [str(p) for p in world_sizes])
    ax.minorticks_off()
    log_axis(ax, bytes_=True)
    ax.set_xlabel("ranks W (log scale)")
    ax.set_ylabel("tree/ring crossover (message size, log scale)")
    ax.set_title("Messages smaller than the crossover go faster on a tree")
    legend_beside(ax)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


# -- the lesson's prediction (prediction.py shows and scores it): lesson 02: one all-reduce, from alpha and beta ---

def _largest_ring_ms(result: dict) -> float | None:
    measured = result.get("measured", {}).get("ring")
    return measured[-1] * 1e3 if measured else None


def _explain_ring(result: dict, predicted: float) -> str:
    fit = resolve_link(result["fit"], "fit")
    model_ms = result["predicted"]["ring"][-1] * 1e3
    return (f"This run's own fit (alpha {fit.alpha_s * 1e6:.0f} us, {fit.bandwidth_GBps:.2g} GB/s) predicts "
            f"<b>{model_ms:.3g} ms</b> for this message: the nearer your number is to it, the nearer your alpha and "
            f"beta were to this run's (lesson 00 fitted them on another day's load). Between the fit and the "
            f"measurement is what one alpha and one beta cannot hold: the ranks share this machine's cores and "
            f"memory, so a large message's copies slow each other down, and the fit is a compromise over every size.")


ALLREDUCE_TIME = Prediction(
    key="02-ring-largest-message", lesson="02", unit="ms",
    question=("How long will <b>one ring all-reduce of the sweep's largest message</b> (32 MiB) take on the panel's "
              "W ranks? Use the alpha and beta lesson 00 fitted for this machine: the ring costs "
              "2(W-1)&middot;alpha + 2(W-1)/W&middot;n&middot;beta."),
    measure=_largest_ring_ms, explain=_explain_ring)
