"""Tables and plots for lesson 13: what the peers of a failed rank saw, a restart, resumes, checkpoint costs
and the checkpoint interval."""
from __future__ import annotations

from textwrap import shorten

from .prediction import Prediction
from .rendering import dress, human_bytes, legend_below, show, table


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:,.0f}"


def fault_name(row: dict) -> str:
    return row["kind"] + (" + DETAIL" if row["debug_detail"] else "")


def render_fault_detection(result: dict) -> None:
    """One line per fault: how long until the peers knew, what they read, and how torchrun ended the job."""
    rows = []
    for row in result["rows"]:
        peer = next(r for r in row["ranks"] if not r["faulty"])
        rows.append([fault_name(row), _ms(row["peers_knew_after_s"]), _ms(row["job_ended_after_s"]),
                     row["torchrun_exit_code"], shorten(peer["error"] or "no error", 150, placeholder=" ...")])
    table(["fault (rank 1)", "peers knew after, ms", "job over after, ms", "torchrun exit", "what rank 0 read"], rows)
    hangs = sorted((row for row in result["rows"] if row["kind"] == "hang"), key=lambda row: row["debug_detail"])
    if hangs and hangs[0]["torchrun_said"]:
        print(f"What torchrun's agent said after the {fault_name(hangs[0])}:\n  " + "\n  ".join(hangs[0]["torchrun_said"]))
    show(plot_fault_detection(result))


def plot_fault_detection(result: dict):
    import matplotlib.pyplot as plt
    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(rows) + 1.4))
    names = [fault_name(r) for r in rows]
    knew = [max(r["peers_knew_after_s"] or 0, 1e-4) * 1e3 for r in rows]
    over = [r["job_ended_after_s"] * 1e3 for r in rows]
    y = range(len(rows))
    ax.barh([i + 0.2 for i in y], knew, height=0.4, color="#C44E52", label="until every peer's collective failed")
    ax.barh([i - 0.2 for i in y], over, height=0.4, color="#8C8C8C", label="until torchrun had ended the job")
    ax.axvline(rows[0]["timeout_s"] * 1e3, color="black", linestyle=":", label="the process group's timeout")
    ax.set_yticks(list(y), names)
    ax.invert_yaxis()
    ax.set_xscale("log")
    dress(ax, "ms after the fault struck (log scale)", None,
          f"{result['world_size']} gloo ranks under torchrun, rank 1 failing", grid="x", legend="below", ncol=3,
          title_size="medium")
    fig.tight_layout()
    return fig


def render_restart(result: dict) -> None:
    print(f"{result['strategy']} on {result['world_size']} ranks, {result['steps']} steps, a checkpoint every "
          f"{result['every']}; rank 1 killed before step {result['fault_step']}, torchrun --max-restarts "
          f"{result['max_restarts']}:")
    table(["restarts", "resumed at step", "steps done twice", "max |dθ| vs untouched run", "seconds, killed job in all"],
          [[result["restarts"], result["resumed_from"], result["steps_redone"], f"{result['max_abs_diff']:.1e}",
            f"{result['seconds_killed']:.1f}"]])
    show(plot_restart(result))


def plot_restart(result: dict):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 3.4))
    steps = result["steps"]  # counted from 0, as `--fault kill@6:1` and the checkpoints count them
    ax.plot(range(steps), result["losses_untouched"], color="#4C72B0", linewidth=3, alpha=0.5,
            label="untouched run")
    start, fault = result["resumed_from"], result["fault_step"]
    ax.plot(range(start, steps), result["losses_killed"], color="#C44E52", marker=".",
            label=f"after the restart (resumed at step {start})")
    twice = list(range(start, fault))
    ax.axvspan(start - 0.5, fault - 0.5, color="#DD8452", alpha=0.25,
               label=f"steps done twice ({', '.join(map(str, twice))})" if twice else "steps done twice (none)")
    ax.set_xlabel("step (counted from 0)")
    ax.set_ylabel("training loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def render_resume(result: dict) -> None:
    where = f"W={result['world_size']}"
    print(f"{result['strategy']} at {where}, {result['precision']}, input noise {result['input_noise']:g}; "
          f"interrupted after {result['stop_at']} of {result['steps']} steps (steps 0-{result['stop_at'] - 1}); a checkpoint is "
          f"{human_bytes(result['checkpoint']['bytes'])} and took {result['checkpoint']['seconds'] * 1e3:.0f} ms")
    fp16 = result["precision"] == "fp16"
    table(["run", "restored", "max |dθ| vs untouched", "equal"] + (["steps fp16 skipped, of the steps it trained"] if fp16 else []),
          [[name, ", ".join(run["restored"]) or "-", f"{run['max_abs_diff']:.1e}", "yes" if run["equal"] else "NO"]
           + ([f"{run['skipped_steps']} of steps {run['resumed_from']}-{result['steps'] - 1}"] if fp16 else [])
           for name, run in result["runs"].items()])
    show(plot_resume(result))


def plot_resume(result: dict):
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
    fig, ax = plt.subplots(figsize=(9, 3.6))
    for name, run in result["runs"].items():
        if name == "untouched":
            continue
        start, gap = run["resumed_from"], run["loss_gap"]
        ax.plot(range(start, start + len(gap)), gap, marker=".", label=name)  # steps counted from 0, as the text does
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xlabel("step (counted from 0)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers: no tick at 5.5
    ax.set_ylabel("loss minus the untouched run's")
    ax.set_title("after the resume: a line on zero is a run that went on as if never stopped", fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    return fig


def _ms_spread(row: dict, name: str) -> str:
    """``45 (41-52)``: the median and its interval, in ms (a row without spreads: the value alone)."""
    spread = row.get("spreads", {}).get(name)
    if spread is None:
        return _ms(row[name])
    return f"{spread['median'] * 1e3:,.0f} ({spread['low'] * 1e3:,.0f}-{spread['high'] * 1e3:,.0f})"


def render_cost(result: dict) -> None:
    print(f"The median of {result['rounds']} interleaved rounds of each kind, and its interval (the slowest rank in "
          f"each round; dpteach/measure.py):")
    table(["strategy", "dcp.save, ms", "async_save blocks, ms", "async_save done, ms", "written per rank",
           "checkpoint in all"],
          [[r["strategy"], _ms_spread(r, "sync_s"), _ms_spread(r, "async_blocked_s"), _ms_spread(r, "async_total_s"),
            " + ".join(human_bytes(b) for b in r["rank_bytes"]), human_bytes(r["total_bytes"])]
           for r in result["rows"]])


def render_interval(result: dict) -> None:
    hours = result["job_mtbf_s"] / 3600
    print(f"{result['gpus']:,} GPUs, each failing every {result['gpu_mtbf_hours']:,.0f} h on average: the job fails "
          f"every {hours:.2f} h. Checkpoint {result['checkpoint_s']:g} s, restart {result['restart_s']:g} s.")
    table(["rule", "interval, minutes", "time lost (Daly's expectation)"],
          [["Young 1974", f"{result['young_s'] / 60:.1f}", f"{result['lost_at_young']:.1%}"],
           ["Daly 2006", f"{result['daly_s'] / 60:.1f}", f"{result['lost_at_daly']:.1%}"],
           ["best of the simulated sweep", f"{result['simulated_best_s'] / 60:.1f}",
            f"{min(r['simulated'] for r in result['rows']):.1%} (simulated)"]])
    show(plot_interval(result))


def plot_interval(result: dict):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 3.8))
    rows = result["rows"]
    minutes = [r["interval_s"] / 60 for r in rows]
    ax.plot(minutes, [r["expected"] * 100 for r in rows], color="#4C72B0", label="Daly's expectation")
    ax.plot(minutes, [r["first_order"] * 100 for r in rows], color="#8C8C8C", linestyle="--",
            label="first order: C/τ + τ/2M + R/M")
    ax.scatter(minutes, [r["simulated"] * 100 for r in rows], color="#C44E52", zorder=3,
               label=f"simulated job (~{sum(r['failures'] for r in rows) // len(rows)} failures per point)")
    ax.axvline(result["young_s"] / 60, color="#55A868", linestyle=":", label="Young's interval")
    ax.set_xscale("log")
    dress(ax, "checkpoint interval τ, minutes of work (log scale)", "% of wall time lost", legend="below")
    fig.tight_layout()
    return fig


def render_replica_groups(result: dict) -> None:
    table(["group 0's steps alone", "group 0's longest step, s", "its median step, s", "replacement joined at step",
           "steps not committed", "max |dθ| group 0 vs replacement"],
          [[result["group0_steps_alone"], f"{result['group0_longest_step_s']:.2f}",
            f"{result['group0_median_step_s']:.2f}", result["replacement_joined_at_step"], result["group0_uncommitted"],
            f"{result['max_abs_diff']:.1e}"]])
    show(plot_replica_groups(result))


def plot_replica_groups(result: dict):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 3.6))
    origin = min(log[0]["at"] for log in result["logs"].values())
    styles = {"group0": ("#4C72B0", "group 0"), "group1": ("#C44E52", "group 1 (killed)"),
              "replacement": ("#55A868", "group 1's replacement")}
    for name, log in result["logs"].items():
        color, label = styles[name]
        ax.plot([r["at"] - origin for r in log], [r["step"] for r in log], color=color, alpha=0.6, label=label)
        alone = [r for r in log if r["participants"] == 1]
        ax.scatter([r["at"] - origin for r in alone], [r["step"] for r in alone], color=color, marker="o",
                   facecolors="none", zorder=3)
    ax.axvline(result["killed_at"] - origin, color="black", linestyle=":", label="SIGKILL")
    ax.axvline(result["replacement_told"] - origin, color="#55A868", linestyle="--",
               label=f"spare told to take over ({result['replace_after_s']:g} s after group 1 died)")
    ax.axvline(result["replacement_started"] - origin, color="#55A868", linestyle=":",
               label="its Manager built, its loop begins")
    ax.set_xlabel("seconds")
    ax.set_ylabel("the job's step")
    ax.set_title("torchft, two replica groups of one CPU rank: hollow marks = a step trained alone", fontsize="medium")
    ax.grid(alpha=0.3)
    legend_below(ax, ncol=3)
    fig.tight_layout()
    return fig


# -- the lesson's prediction (prediction.py shows and scores it): lesson 13: how often to checkpoint ---------------

def _young_minutes(result: dict) -> float | None:
    return result["young_s"] / 60 if "young_s" in result else None


def _explain_interval(result: dict, predicted: float) -> str:
    return (f"The job fails every {result['job_mtbf_s'] / 60:.0f} minutes on average (one GPU's MTBF divided by "
            f"{result['gpus']:,} GPUs), and sqrt(2 x {result['checkpoint_s']:g} s x {result['job_mtbf_s']:.0f} s) = "
            f"{result['young_s'] / 60:.1f} minutes. The curve is flat near its bottom: an interval off by a factor of "
            f"two costs a few points of time, while one off by ten costs many more; and the interval grows only as the "
            f"square root of the checkpoint's cost.")


CHECKPOINT_INTERVAL = Prediction(
    key="13-young-interval", lesson="13", unit="min",
    question=("With the panel's GPUs, failure rate and checkpoint cost, how many <b>minutes of work between "
              "checkpoints</b> lose the least time, by Young's rule?"),
    measure=_young_minutes, explain=_explain_interval, obtained="computed")
