"""Plots and tables for ``notebooks/04_overlap.ipynb`` (data from ``dpteach.experiments.overlap_timeline``).

Everything here draws what a run returned; nothing trains or measures.
"""
from __future__ import annotations

from html import escape

import matplotlib.pyplot as plt
from IPython.display import HTML, display

from .gantt import plot_gantt
from .prediction import Prediction
from .rendering import html_table, human_bytes, legend_beside, show  # noqa: F401 (html_table: lesson 04 imports it from here)

TIMELINE_STRATEGIES = ("naive", "bucketed", "overlap", "ddp")
CAPTIONS = {
    "local": "no communication: the compute floor",
    "naive": "one all-reduce per parameter, after backward",
    "bucketed": "one all-reduce per bucket, after backward",
    "overlap": "bucket all-reduces launched from backward hooks",
    "ddp": "torch DistributedDataParallel",
    "int8": "8-bit gradients, all-gathered after backward",
}


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def _row(result, strategy):
    return next(r for r in result["strategies"] if r["strategy"] == strategy)


def plot_timelines(result: dict, strategies=TIMELINE_STRATEGIES, ranks=None) -> list:
    """One Gantt chart per strategy, all on the same time axis, each showing its run's median step.

    ``ranks``: which ranks to draw (default the first two - the others look alike).
    """
    ranks = list(ranks) if ranks is not None else list(range(min(2, result.get("real_ranks", result["world_size"]))))
    spans_of = {s: {r: result["timelines"][s][r] for r in ranks} for s in strategies}
    width = 0.0
    for timelines in spans_of.values():
        spans = [span for rank_spans in timelines.values() for span in rank_spans]
        if spans:
            width = max(width, max(s["end"] for s in spans) - min(s["start"] for s in spans))
    figures = []
    for strategy in strategies:
        row = _row(result, strategy)
        fig, ax = plt.subplots(figsize=(10, 1.6 + 0.95 * len(ranks)))
        title = (f"{strategy}: {CAPTIONS[strategy]}  |  median step {_ms(row['step_time_s'])} ms, "
                 f"exposed communication {_ms(row['exposed_comm_s'])} ms")
        plot_gantt(spans_of[strategy], ax=ax, title=title, device=result["device"])
        ax.set_xlim(0, width * 1e3 * 1.02)
        ax.set_xlabel("time from the start of the step (ms)")
        ax.title.set_fontsize(10)
        fig.tight_layout()
        figures.append(fig)
    return figures


def plot_step_breakdown(result: dict, strategies=("naive", "bucketed", "overlap", "ddp", "int8")):
    """Each strategy's step: the compute floor (``local``), the communication its ranks waited for
    (measured where they waited), and the rest - overhead (packing, casting, launching, slower compute)."""
    floor = _row(result, "local")["step_time_s"] * 1e3
    exposed = [_row(result, s)["exposed_comm_s"] * 1e3 for s in strategies]
    overhead = [(_row(result, s)["overhead_s"] or 0.0) * 1e3 for s in strategies]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.bar(strategies, [floor] * len(strategies), color="#55A868", label="compute floor (local, no communication)")
    ax.bar(strategies, exposed, bottom=[floor] * len(strategies), color="#C44E52",
           label="exposed communication (waited for, measured)")
    ax.bar(strategies, overhead, bottom=[floor + e for e in exposed], color="#B0B0B0",
           label="overhead (the rest of the step above local)")
    spreads = [(_row(result, s).get("spread") or {}).get("step_s") for s in strategies]
    if all(spreads):  # the whole step's interval over the timed steps (the rounds of the interleaved run)
        ax.errorbar(range(len(strategies)), [sp["median"] * 1e3 for sp in spreads],
                    yerr=[[(sp["median"] - sp["low"]) * 1e3 for sp in spreads],
                          [(sp["high"] - sp["median"]) * 1e3 for sp in spreads]],
                    fmt="none", ecolor="black", capsize=4, lw=1, label="step: interval of the timed steps")
    top = [max(floor + e + o, (sp or {}).get("high", 0) * 1e3) for e, o, sp in zip(exposed, overhead, spreads)]
    for x, (value, height) in enumerate(zip(exposed, top)):
        ax.text(x, height, f"+{value:.1f}", ha="center", va="bottom", fontsize=9, color="#C44E52")
    ax.set_ylabel("median time per optimizer step (ms)")
    ax.set_xlabel("strategy (the red number: communication waited for, ms)")
    ax.set_title(f"Where a step's time goes: {result['model']}, W={result['world_size']} "
                 f"({result['backend']}, {result['device']}), bucket cap {result['bucket_mb']:g} MiB", fontsize=10)
    ax.set_ylim(0, max(max(top, default=0), floor) * 1.2)
    legend_beside(ax)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def equivalence_table(result: dict) -> HTML:
    """max |theta_dp - theta_single| per strategy against the stated float32 tolerance (with emulated peers:
    a sentence saying why there is none)."""
    if result.get("peers") == "emulated":
        return HTML("<p>With emulated peers one real rank trained: nothing was averaged, so there is no "
                    "equivalence to show. Run with real ranks to see it.</p>")
    rows = []
    for row in result["strategies"]:
        if row["strategy"] == "local":
            continue
        same = row["max_abs_diff_vs_single"] <= result["tolerance"]
        rows.append([row["strategy"], f"{row['max_abs_diff_vs_single']:.2e}", f"{result['tolerance']:.0e}",
                     "yes" if row["replicas_identical"] else "no", "yes" if same else "<b>no</b>"])
    return html_table(["strategy", "max |dtheta| vs single process", "tolerance", "replicas identical",
                       "equals single process"], rows, align="lrrll")


def candidates_table(result: dict) -> HTML:
    """The practice question's answers, measured: what each costs and whether the result stays identical."""
    rows = []
    for c in result["candidates"]:
        same = "-" if c["identical"] is None else ("yes" if c["identical"] else "<b>no</b>")
        diff = "-" if c["max_abs_diff_vs_single"] is None else f"{c['max_abs_diff_vs_single']:.1e}"
        rows.append([escape(c["answer"]), c["samples_per_step"], f"{c['messages_per_step']:.0f}",
                     human_bytes(c["bytes_per_step"]), _ms(c["step_time_s"]), _ms(c["exposed_comm_s"]),
                     f"{c['exposed_comm_per_sample_s'] * 1e6:.0f}", diff, same])
    return html_table(["answer", "samples / step", "messages / step", "sent / step", "step (ms)",
                       "exposed comm (ms)", "exposed comm / sample (us)", "max |dtheta|", "identical?"],
                      rows, align="lrrrrrrrl")


def render(result: dict) -> None:
    """What the panel shows after a run: timelines, the step-time breakdown, and both tables."""
    print(f"W={result['world_size']} ranks ({result['backend']} on {result['device']}), model {result['model']}, "
          f"bucket cap {result['bucket_mb']:g} MiB; each timeline shows the run's median step")
    if result.get("peers_note"):
        print(f"{result['peers_note']}: the timelines show the one real rank")
    for fig in plot_timelines(result):
        show(fig)
    show(plot_step_breakdown(result))
    display(equivalence_table(result))


# -- the lesson's prediction (prediction.py shows and scores it): lesson 04: what overlap hides --------------------

def _rows(result: dict) -> dict:
    return {row["strategy"]: row for row in result.get("strategies", [])}


def _overlap_vs_naive(result: dict) -> float | None:
    rows = _rows(result)
    if not {"naive", "overlap"} <= set(rows) or not rows["naive"]["exposed_comm_s"]:
        return None
    return rows["overlap"]["exposed_comm_s"] / rows["naive"]["exposed_comm_s"]


def _explain_overlap(result: dict, predicted: float) -> str:
    rows = _rows(result)
    naive, overlap = rows["naive"], rows["overlap"]
    return (f"naive sent {naive['messages']:.0f} messages per step, all after backward, and its ranks waited "
            f"{naive['exposed_comm_s'] * 1e3:.3g} ms for them; overlap sent {overlap['messages']:.0f} buckets, the "
            f"first while backward was still computing, and waited {overlap['exposed_comm_s'] * 1e3:.3g} ms - only "
            f"for what was still on the wire when backward ended. Fewer messages save latency (alpha per message); "
            f"starting early hides bandwidth time behind backward, up to as long as backward lasts.")


OVERLAP_EXPOSED = Prediction(
    key="04-overlap-exposed-vs-naive", lesson="04", unit="x naive's",
    question=("What will <b>overlap's exposed communication</b> per step be, as a fraction of <b>naive's</b> (1 = no "
              "better, 0 = all hidden)? Think of the number of messages each sends and of how long backward lasts."),
    measure=_overlap_vs_naive, explain=_explain_overlap)
