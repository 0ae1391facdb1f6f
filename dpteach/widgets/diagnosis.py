"""Lesson 17's view of a diagnosis: where each rank's median step went, and the findings with their lessons."""
from __future__ import annotations

from html import escape

from IPython.display import HTML, display

from .rendering import dress, show, table

PARTS = (("compute_ms", "compute", "#4c72b0"), ("data_ms", "data loading", "#dd8452"),
         ("hidden_ms", "communication under other work", "#8fbc8f"),
         ("exposed_comm_ms", "exposed communication", "#c44e52"), ("idle_ms", "idle", "#bbbbbb"))


def _parts(rank: dict) -> dict:
    return {**rank, "hidden_ms": max(0.0, rank["comm_ms"] - rank["exposed_comm_ms"])}


def plot_steps(diagnosis: dict):
    """One horizontal bar per rank: its median step, cut into compute, data, communication (hidden, exposed), idle."""
    import matplotlib.pyplot as plt
    ranks = [_parts(r) for r in diagnosis["ranks"]]
    fig, ax = plt.subplots(figsize=(6.5, 1.2 + 0.45 * len(ranks)))
    for key, label, colour in PARTS:
        left = [sum(r[k] for k, _, _ in PARTS[:[p[0] for p in PARTS].index(key)]) for r in ranks]
        ax.barh([f"rank {r['rank']}" for r in ranks], [r[key] for r in ranks], left=left, label=label, color=colour)
    ax.invert_yaxis()
    dress(ax, xlabel="ms of the median step (each part's median)",
          title=f"Where each rank's step went ({diagnosis['job']['steps']} steps recorded)", grid="x", legend="beside")
    return fig


def findings_html(diagnosis: dict) -> str:
    findings = diagnosis["findings"]
    if not findings:
        return (f"<p><b>No finding</b> costs {diagnosis['job']['threshold']:.0%} of a step or more: nothing here "
                f"for the lessons to fix.</p>")
    items = "".join(f"<li><b>[{f['cost']:.0%} of a step] lesson {escape(f['lesson'])}</b>: {escape(f['message'])}."
                    f"<br><i>Try</i>: {escape(f['try'])}.</li>" for f in findings)
    return f"<ol class='dpteach-findings'>{items}</ol>"


def render(result: dict) -> None:
    """The per-rank table, the step bars, and the findings (largest first)."""
    diagnosis = result["diagnosis"]
    job = diagnosis["job"]
    table(["rank", "step ms", "compute", "data", "comm", "exposed comm", "idle", "collectives / step", "late ms"],
          [[r["rank"], f"{r['step_ms']:.1f}", f"{r['compute_ms']:.1f}", f"{r['data_ms']:.1f}", f"{r['comm_ms']:.1f}",
            f"{r['exposed_comm_ms']:.1f}", f"{r['idle_ms']:.1f}", f"{r['collectives_per_step']:.0f}",
            f"{r['late_ms']:.1f}"] for r in diagnosis["ranks"]],
          title=f"{job['world_size']} ranks ({job['backend']}), medians over {job['steps']} recorded steps; "
                f"read from {job['reader']} in {diagnosis['read_s']:.1f} s")
    show(plot_steps(diagnosis))
    display(HTML(findings_html(diagnosis)))
