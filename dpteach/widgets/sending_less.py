"""Tables and plots for lesson 14: what each method sends, how its loss falls per step and per second on
each link, PowerSGD against torch's hook, and hybrid sharding's two levels."""
from __future__ import annotations

from .rendering import human_bytes, legend_below, show, table

FAMILY_COLOURS = {"ddp": "#4C72B0", "bf16": "#64B5CD", "int8_ef": "#8C8C8C", "powersgd": "#DD8452",
                  "local_sgd": "#55A868", "diloco": "#C44E52"}
DASHES = {1: (1, 1), 4: (4, 2), 8: (4, 2), 16: (None, None), 32: (None, None)}


def _style(method: str) -> dict:
    family, _, value = method.partition("@")
    style = {"color": FAMILY_COLOURS.get(family, "black"), "label": method, "linewidth": 1.6}
    if value:
        dash = DASHES.get(int(value), (None, None))
        style["linestyle"] = "-" if dash == (None, None) else (0, dash)
    return style


def _reached(row: dict) -> str:
    return "not reached" if row["steps_to_target"] is None else str(row["steps_to_target"])


def _loss_range(result: dict) -> tuple[float, float]:
    """From a little under the lowest curve to a little over where training started: a method that diverges
    leaves the plot at the top (the table says where it ended) instead of flattening every other curve."""
    low = min(min(r["curve"]) for r in result["rows"])
    return 0.9 * low, 1.15 * result["reference"][0]


def render_methods(result: dict) -> None:
    """Bytes per step and steps to the target for every method, and their loss curves against steps."""
    table(["method", "sends per step", "x ddp", "steps to target", f"loss, last {result['window']} steps"],
          [[r["method"], human_bytes(r["bytes_per_step"]),
            "-" if r["bytes_vs_ddp"] is None else f"{r['bytes_vs_ddp']:.3g}", _reached(r), f"{r['final_loss']:.3f}"]
           for r in result["rows"]])
    show(plot_methods(result))


def plot_methods(result: dict):
    import matplotlib.pyplot as plt
    fig, (curves, sent) = plt.subplots(1, 2, figsize=(12, 4.6), gridspec_kw={"width_ratios": [3, 2]})
    for row in result["rows"]:
        curves.plot(range(1, len(row["curve"]) + 1), row["curve"], **_style(row["method"]))
    curves.axhline(result["target_loss"], color="black", linestyle=":", label="target loss")
    curves.set_ylim(*_loss_range(result))
    curves.set_xlabel("step")
    curves.set_ylabel(f"training loss (mean of the last {result['window']} steps)")
    curves.set_title(f"Loss per step ({result['world_size']} ranks, MLP, {result['optimizer']})", fontsize="medium")
    curves.grid(alpha=0.3)
    rows = result["rows"]
    sent.barh(range(len(rows)), [max(r["bytes_per_step"], 1) for r in rows],
              color=[_style(r["method"])["color"] for r in rows])
    sent.set_yticks(range(len(rows)), [r["method"] for r in rows])
    sent.invert_yaxis()
    sent.set_xscale("log")
    sent.set_xlabel("bytes each rank sends per step (log scale)")
    sent.set_title("What a step puts on the wire", fontsize="medium")
    sent.grid(axis="x", alpha=0.3)
    legend_below(curves, ncol=4)
    fig.tight_layout()
    return fig


def render_time_to_target(timing: dict, methods: dict) -> None:
    """Seconds to the target loss for every method on every link (the fastest on each link first), and the
    loss against the emulated wall-clock."""
    links = [link["name"] for link in timing["links"]]
    by = {(r["method"], r["link"]): r for r in timing["rows"]}
    names = [r["method"] for r in methods["rows"]]
    seconds = lambda m, l: by[m, l]["time_to_target_s"]  # noqa: E731
    cell = lambda m, l: ("not reached" if seconds(m, l) is None else  # noqa: E731
                         f"{seconds(m, l):.2f} s" + (" (fastest)" if timing["winner"][l] == m else ""))
    table(["method"] + [f"to target on {l}" for l in links] + [f"mean step on {l}" for l in links],
          [[m] + [cell(m, l) for l in links] + [f"{by[m, l]['mean_step_s'] * 1e3:.1f} ms" for l in links]
           for m in names])
    show(plot_time_to_target(timing, methods))


def plot_time_to_target(timing: dict, methods: dict):
    import matplotlib.pyplot as plt
    links = timing["links"]
    fig, axes = plt.subplots(1, len(links), figsize=(4.4 * len(links), 4.4), sharey=True, squeeze=False)
    curves = {r["method"]: r["curve"] for r in methods["rows"]}
    for ax, link in zip(axes[0], links):
        for row in (r for r in timing["rows"] if r["link"] == link["name"]):
            ax.plot(row["seconds"], curves[row["method"]], **_style(row["method"]))
        ax.axhline(timing["target_loss"], color="black", linestyle=":", label="target loss")
        ax.set_ylim(*_loss_range(methods))
        ax.set_xscale("log")
        ax.set_xlabel("emulated wall-clock, s (log scale)")
        ax.set_title(f"{link['name']}: {link['alpha_s'] * 1e3:g} ms, {1 / link['beta_s_per_byte'] / 1e9:g} GB/s",
                     fontsize="medium")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("training loss (running mean)")
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=7, fontsize="small", frameon=False)
    return fig


def render_outer_step(result: dict) -> None:
    """The DiLoCo panel: local SGD and DiLoCo at one H, their curves and steps to the target."""
    render_methods(result)


def render_powersgd_check(result: dict) -> None:
    """Step by step: whether PowerSGD compressed, how far the course's mean gradient is from torch's hook's, and
    the bytes each sent against an uncompressed all-reduce."""
    table(["step", "compressed", "max |course - torch|", "course sent", "torch sent", "uncompressed", "all-reduces"],
          [[r["step"], "yes" if r["compressed"] else "no (plain all-reduce)", f"{r['max_abs_diff']:.2e}",
            human_bytes(r["course_bytes"]), human_bytes(r["torch_bytes"]), human_bytes(r["uncompressed_bytes"]),
            f"{r['course_all_reduces']} / {r['torch_all_reduces']}"] for r in result["rows"]],
          title=f"PowerSGD at rank {result['rank']} on {result['world_size']} ranks, the {result['model']}'s gradients")
    print(f"Compared: {result['compared']}.")


def render_hybrid(result: dict) -> None:
    """Per strategy: step time on the two-level link, bytes per step in all, across nodes and inside them (counted;
    received on the groups' sockets where measured), against what the replicate all-reduce should send."""
    size = lambda n: "-" if n is None else human_bytes(n)  # noqa: E731
    set_by = lambda r: (r["time_set_by"] or "-") + ("" if r["across_time_set_by"] is None  # noqa: E731
                                                     else f" / {r['across_time_set_by']}")
    table(["strategy", "step", "sends per step", "across nodes", "inside nodes", "received across (sockets)",
           "expected across", "max |dθ| vs 1 process", "time set by"],
          [[r["strategy"], f"{r['step_time_s'] * 1e3:.0f} ms" + ("" if r["timed_on_link"] else " *"),
            size(r["bytes_per_step"]), size(r["bytes_between_per_step"]), size(r["bytes_inside_per_step"]),
            size(r["received_between_per_step"]), size(r["expected_between_per_step"]),
            "-" if r["max_abs_diff_vs_single"] is None else f"{r['max_abs_diff_vs_single']:.1e}", set_by(r)]
           for r in result["rows"]],
          title=f"{result['world_size']} ranks as {result['nodes']} nodes of {result['ranks_per_node']}, "
                f"link {result['link']['name']}")
    for name, why in result["not_emulated"].items():
        print(f"* {name}: {why}.")
    print("'time set by': whether the emulated link or this machine's own transfers set the time of most messages "
          "(for hsdp: inside a node / across nodes).")
    show(plot_hybrid(result))


def plot_hybrid(result: dict):
    import matplotlib.pyplot as plt
    rows = [r for r in result["rows"] if r["bytes_between_per_step"] is not None]
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(rows) + 1.6))
    y = range(len(rows))
    ax.barh(y, [r["bytes_between_per_step"] / 1e6 for r in rows], color="#C44E52", label="across nodes (slow link)")
    ax.barh(y, [r["bytes_inside_per_step"] / 1e6 for r in rows], left=[r["bytes_between_per_step"] / 1e6 for r in rows],
            color="#4C72B0", label="inside a node (fast link)")
    ax.set_yticks(list(y), [r["strategy"] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("MB each rank sends per step (the ring's account)")
    ax.set_title(f"Where the bytes go on {result['link']['name']}", fontsize="medium")
    ax.grid(axis="x", alpha=0.3)
    legend_below(ax, ncol=2)
    fig.tight_layout()
    return fig
