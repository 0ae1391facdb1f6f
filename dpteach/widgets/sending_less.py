"""Tables and plots for lesson 14: what each method sends, how its loss falls per step and per second on
each link, PowerSGD against torch's hook, and hybrid sharding's two levels."""
from __future__ import annotations

import statistics

from ..measure import spread
from ..sync import strategy_class
from .rendering import dress, human_bytes, legend_below, log_axis, show, table

DASHES = {1: (1, 1), 4: (4, 2), 8: (4, 2), 16: (None, None), 32: (None, None)}


def _style(method: str) -> dict:
    family, _, value = method.partition("@")  # a variant is drawn in its strategy's colour, dashed by its knob
    style = {"color": strategy_class(family).colour, "label": method, "linewidth": 1.6}
    if value:
        dash = DASHES.get(int(value), (None, None))
        style["linestyle"] = "-" if dash == (None, None) else (0, dash)
    return style


def _reached(row: dict) -> str:
    return "not reached" if row["steps_to_target"] is None else str(row["steps_to_target"])


def _final(row: dict) -> str:
    """The loss over the last steps, or where a diverged run's loss stopped being a number."""
    if row.get("diverged_at") is None:
        return f"{row['final_loss']:.3f}"
    return f"diverged: nan from step {row['diverged_at']}"


def _loss_range(result: dict) -> tuple[float, float]:
    """From a little under the lowest curve to a little over where training started: a method that diverges is
    cut off at the top, and marked there (``_mark_diverged``), instead of flattening every other curve."""
    low = min(min(v for v in r["curve"] if v == v) for r in result["rows"])  # v == v: not nan
    return 0.9 * low, 1.15 * result["reference"][0]


def _mark_diverged(ax, xs, curve, top: float, style: dict) -> None:
    """Where a curve leaves the plot at the top (or stops being a number), an x on the top edge, labelled."""
    gone = next((i for i, v in enumerate(curve) if not v == v or v > top), None)
    if gone is not None:
        ax.plot([xs[gone]], [top], marker="x", markersize=9, color=style["color"], clip_on=False)
        ax.annotate(f"{style['label']} diverges", (xs[gone], top), textcoords="offset points", xytext=(-4, -12),
                    ha="right", fontsize="small", color=style["color"])


def message_label(key: str) -> str:
    """``all_reduce bfloat16 2178068`` -> ``all-reduce of 2.1 MiB (bfloat16)`` (float32, the usual, unsaid)."""
    kind, dtype, nbytes = key.split()
    return f"{kind.replace('_', '-')} of {human_bytes(int(nbytes))}" + ("" if dtype == "float32" else f" ({dtype})")


def render_methods(result: dict) -> None:
    """Bytes per step and steps to the target for every method, and their loss curves against steps."""
    table(["method", "sends per step", "x ddp", "messages per exchange", "steps to target",
           f"loss, last {result['window']} steps"],
          [[r["method"], human_bytes(r["bytes_per_step"]),
            "-" if r["bytes_vs_ddp"] is None else f"{r['bytes_vs_ddp']:.3g}",
            max((len(step) for step in r["messages"]), default=0), _reached(r), _final(r)]
           for r in result["rows"]])
    show(plot_methods(result))


def plot_methods(result: dict):
    import matplotlib.pyplot as plt
    fig, (curves, sent) = plt.subplots(1, 2, figsize=(12, 4.6), gridspec_kw={"width_ratios": [3, 2]})
    low, top = _loss_range(result)
    for row in result["rows"]:
        steps = range(1, len(row["curve"]) + 1)
        curves.plot(steps, row["curve"], **_style(row["method"]))
        _mark_diverged(curves, list(steps), row["curve"], top, _style(row["method"]))
    curves.axhline(result["target_loss"], color="black", linestyle=":", label="target loss")
    curves.set_ylim(low, top)
    curves.set_xlabel("step")
    curves.set_ylabel(f"training loss (mean of the last {result['window']} steps)")
    curves.set_title(f"Loss per step ({result['world_size']} ranks, MLP, {result['optimizer']})", fontsize="medium")
    curves.grid(alpha=0.3)
    rows = result["rows"]
    sent.barh(range(len(rows)), [max(r["bytes_per_step"], 1) for r in rows],
              color=[_style(r["method"])["color"] for r in rows])
    sent.set_yticks(range(len(rows)), [r["method"] for r in rows])
    sent.invert_yaxis()
    log_axis(sent, "x", bytes_=True)
    dress(sent, "bytes each rank sends per step (log scale)", None, "What a step puts on the wire", grid="x",
          title_size="medium")
    legend_below(curves, ncol=4)
    fig.tight_layout()
    return fig


def _ms(samples) -> str:
    return spread(samples).scaled(1e3).text("ms", 1 if statistics.median(samples) < 0.1 else 0)


def _exchanges(row: dict) -> str:
    if not row["exchanges"]:
        return "none"
    return " + ".join(f"{e['count']} x {e['each_s'] * 1e3:.1f} ms" for e in row["exchanges"])


def render_time_to_target(timing: dict, methods: dict) -> None:
    """The measured parts (each method's compute per step, each message on each link), then for every link each
    method's sum of them up to the step it reached the target, and the figures."""
    links = [link["name"] for link in timing["links"]]
    rows = {(r["method"], r["link"]): r for r in timing["rows"]}
    names = [r["method"] for r in methods["rows"]]
    rounds = timing["rounds"]
    table(["method", "compute per step", "messages per exchange"],
          [[m, _ms(rows[m, links[0]]["compute"]), " + ".join(message_label(k) for k in
                                                              max(methods["rows"][i]["messages"], key=len))
            or "-"] for i, m in enumerate(names)],
          title=f"Measured: compute per step, no link (median and interval of {rounds} interleaved rounds)")
    exchange = timing["exchange"]
    keys = sorted({k for link in links for k in exchange[link]}, key=lambda k: int(k.split()[2]))
    table(["message"] + [f"one on {link}" for link in links],
          [[message_label(k)] + [_ms(exchange[link][k]) for link in links] for k in keys],
          title=f"Measured: one message on each emulated link ({rounds} rounds, the same ones)")
    for link in links:
        verdict = timing["ranking"][link]
        table(["method", "steps to target", "steps x compute", "exchanges x each", "time to target (interval)"],
              [[m, _reached(rows[m, link])] + (["-", "-"] if rows[m, link]["totals"] is None else
                                                [f"{rows[m, link]['compute_s']:.2f} s", _exchanges(rows[m, link])]) +
               ["-" if rows[m, link]["totals"] is None else
                f"{rows[m, link]['time_to_target_s']:.2f} s ({rows[m, link]['low']:.2f}-{rows[m, link]['high']:.2f})"
                + (" fastest" if verdict["winner"] == m else " leader, within noise"
                   if verdict["winner"] is None and m in verdict["leaders"] else "")]
               for m in names],
              title=f"On {link}: the parts added up (medians; the total is the median of the rounds' totals)")
    show(plot_time_to_target(timing, methods))


def plot_time_to_target(timing: dict, methods: dict):
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator
    links = timing["links"]
    fig, axes = plt.subplots(2, len(links), figsize=(4.6 * len(links), 9.2), squeeze=False)
    curves = {r["method"]: r["curve"] for r in methods["rows"]}
    names = [r["method"] for r in methods["rows"]]
    low, top = _loss_range(methods)
    for bars, ax, link in zip(axes[0], axes[1], links):
        mine = {r["method"]: r for r in timing["rows"] if r["link"] == link["name"]}
        # a network's bandwidth in bits per second, as Ethernet is named (and as the lesson's text gives it)
        title = f"{link['name']}: {link['alpha_s'] * 1e3:g} ms per message, {8 / link['beta_s_per_byte'] / 1e9:g} Gbit/s"
        for y, name in enumerate(names):
            row = mine[name]
            if row["totals"] is None:
                bars.text(0, y, "  not reached", va="center", fontsize="small", color="gray")
                continue
            bars.barh(y, row["compute_s"], color="#8C8C8C", label="steps x compute" if y == 0 else None)
            bars.barh(y, row["exchange_s"], left=row["compute_s"], color=_style(name)["color"],
                      label="exchanges x each (colour: method)" if y == 0 else None)
            bars.errorbar(row["time_to_target_s"], y, xerr=[[row["time_to_target_s"] - row["low"]],
                                                            [row["high"] - row["time_to_target_s"]]],
                          color="black", capsize=3, linewidth=1)
        bars.set_yticks(range(len(names)), names)
        bars.invert_yaxis()
        bars.set_xlabel("seconds to the target loss (bar: interval of the total)")
        bars.set_title(title, fontsize="medium")
        bars.grid(axis="x", alpha=0.3)
        for name in names:
            row = mine[name]
            ax.plot(row["seconds"], curves[name], **_style(name))
            _mark_diverged(ax, row["seconds"], curves[name], top, _style(name))
        ax.axhline(timing["target_loss"], color="black", linestyle=":", label="target loss")
        ax.set_ylim(low, top)
        log_axis(ax, "x")
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 3.0)))  # four decades in a narrow panel: 1-3-10 stays legible
        ax.set_xlabel("seconds, from the parts' medians (log scale)")
        ax.set_title(title, fontsize="medium")
        ax.grid(alpha=0.3)
    axes[1][0].set_ylabel("training loss (running mean)")
    legend_below(axes[0][0], ncol=1)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    handles, labels = axes[1][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=7, fontsize="small", frameon=False)
    return fig


def render_outer_step(result: dict) -> None:
    """The DiLoCo panel: local SGD and DiLoCo at one H, their curves and steps to the target."""
    if result.get("reused"):
        print("These settings are the lesson's own run above: its two rows, not trained again.")
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
    rows = [r for r in result["rows"] if r["bytes_between_per_step"] is not None]
    return plot_levels(rows, [r["strategy"] for r in rows], "MiB each rank sends per step (the ring's account)",
                       f"Where the bytes go on {result['link']['name']}")


def plot_levels(rows: list, names: list, xlabel: str, title: str):
    """One bar per row: the bytes a rank sends per step across nodes, then inside a node, stacked (lesson 14's
    hybrid sharding, lesson 16's ZeRO++)."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(rows) + 1.6))
    y = range(len(rows))
    mib = 1 << 20  # the unit human_bytes prints in the table
    ax.barh(y, [r["bytes_between_per_step"] / mib for r in rows], color="#C44E52", label="across nodes (slow link)")
    ax.barh(y, [r["bytes_inside_per_step"] / mib for r in rows], left=[r["bytes_between_per_step"] / mib for r in rows],
            color="#4C72B0", label="inside a node (fast link)")
    ax.set_yticks(list(y), names)
    ax.invert_yaxis()
    dress(ax, xlabel, None, title, grid="x", legend="below", title_size="medium")
    fig.tight_layout()
    return fig
