"""Lesson 09's table, read off the ranks: what one world's passes become as a row.

``experiments/scaling.py`` runs, in each world, the strategy and ``local`` (the same work with no
communication) side by side, step by step, for a few passes. This file turns what the ranks sent back
into the numbers the lesson shows, and says how each is taken:

* a step time is the median of every timed step of every pass, each step averaged over the ranks (a
  synchronous step ends together on all of them), with its interval (``dpteach.measure.spread``);
* the breakdown (forward, backward, optimizer, the wait, the rest) comes from the rank's own timeline,
  from the pass with the shortest step: a load spike elsewhere only ever slows a step down;
* exposed communication is measured (``timeline.exposed_time``), and the communication it did not
  expose is what overlap hid - the simulator's ``overlap`` as this run achieved it;
* efficiency and speed-up against W = 1 carry the widest interval the two step times' intervals allow,
  and the worlds are ranked by time per sample only where those intervals separate.
"""
from __future__ import annotations

import statistics

from ..measure import Spread, ranking, spread
from ..ranks.world import World
from ..replica.timeline import busy_time, exposed_time
from ..training.accounting import link_report
from ..training.train import TrainConfig

PHASES = ("forward", "backward", "optimizer", "wait")


def breakdown(spans: list[dict], step_times: list[float], first_step: int) -> dict:
    """Median seconds per step of each compute-lane phase, plus the unaccounted rest of the step."""
    steps = range(first_step, len(step_times)) if len(step_times) > first_step else range(len(step_times))
    per_phase = {name: [] for name in PHASES}
    rest, comm, exposed = [], [], []
    for step in steps:
        mine = [s for s in spans if s["step"] == step]
        accounted = 0.0
        for name in PHASES:
            seconds = sum(s["end"] - s["start"] for s in mine if s["lane"] == "compute" and s["name"] == name)
            per_phase[name].append(seconds)
            accounted += seconds
        rest.append(max(0.0, step_times[step] - accounted))
        comm.append(busy_time(mine, "comm"))
        exposed.append(exposed_time(mine))
    out = {name: statistics.median(v) for name, v in per_phase.items()}
    out["data_and_other"] = statistics.median(rest)
    out["comm_busy"] = statistics.median(comm)  # time with an all-reduce in flight, hidden or not
    out["exposed"] = statistics.median(exposed)  # time the step waited for it (timeline.exposed_time)
    return out


def _step_spread(ranks: list[dict], index: int) -> Spread:
    """Every timed step of config ``index`` over all passes, each step's time averaged over the ranks (a
    synchronous step ends together on all of them): the median and its interval (``dpteach.measure``).
    The configs of a world ran step by step in turn, so their spreads saw the same moments of the machine."""
    passes = ranks[0]["runs"][index]
    steps = [statistics.mean(r["runs"][index][p]["step_times"][s] for r in ranks)
             for p in range(len(passes)) for s in range(passes[p]["warmup"], len(passes[p]["step_times"]))]
    return spread(steps or [statistics.mean(r["runs"][index][0]["step_times"][-1] for r in ranks)])


def _best_pass(ranks: list[dict], index: int) -> dict:
    """The pass with the shortest step (averaged over ranks): a load spike elsewhere only slows steps down."""
    passes = range(len(ranks[0]["runs"][index]))
    best = min(passes, key=lambda p: statistics.mean(r["runs"][index][p]["median_step_s"] for r in ranks))
    keys = ranks[0]["runs"][index][best]["breakdown"]
    account = link_report([r["runs"][index][best] for r in ranks]) or {}
    return {"median_step_s": statistics.mean(r["runs"][index][best]["median_step_s"] for r in ranks),
            "time_set_by": account.get("time_set_by"),
            "final_loss": ranks[0]["runs"][index][best]["final_loss"],
            "breakdown": {k: statistics.mean(r["runs"][index][best]["breakdown"][k] for r in ranks) for k in keys}}


def world_row(ranks, i: int, config: TrainConfig, w: int, world: World, placement, emulated) -> dict:
    """One world's row from its ranks' passes: config ``i`` is local, ``i + 1`` the strategy."""
    local, run = _best_pass(ranks, i), _best_pass(ranks, i + 1)
    step, local_step = _step_spread(ranks, i + 1), _step_spread(ranks, i)
    exposed = run["breakdown"]["exposed"]  # measured: what the step waited for
    # The simulator's "overlap": the share of the compute time that hid communication,
    # exposed = comm - overlap x compute, so overlap = (comm - exposed) / compute.
    hidden = max(0.0, run["breakdown"]["comm_busy"] - exposed)
    link = ranks[0]["link"] or emulated.as_dict()
    return {
        "world_size": w, "step_time_s": step.median, "local_step_s": local_step.median,
        "step": step.as_dict(), "local_step": local_step.as_dict(),
        "samples_per_s": w * config.batch_per_rank / step.median, "exposed_comm_s": exposed,
        "batch_per_rank": config.batch_per_rank, "time_set_by": run["time_set_by"],
        "hidden_comm_s": hidden, "overlap_fraction": min(1.0, hidden / local["median_step_s"]),
        "breakdown": run["breakdown"], "local_breakdown": local["breakdown"],
        "alpha_s": link["alpha_s"], "beta_s_per_byte": link["beta_s_per_byte"],
        "oversubscribed": placement.oversubscribed(world.size), "sharing": placement.describe_sharing(world.size),
        "final_loss": run["final_loss"], "backend": placement.backend, "device": placement.device_type,
    }


def add_efficiencies(rows: list[dict]) -> None:
    """Speed-up and efficiency against W = 1, each with an interval from the two step times' intervals: the
    widest the ratio can be when each step time lies anywhere in its own (a conservative interval)."""
    one, base = rows[0], rows[0]["step"]
    for row in rows:
        row["speedup"] = row["samples_per_s"] / one["samples_per_s"]
        row["efficiency"] = row["samples_per_s"] / (row["world_size"] * one["samples_per_s"])
        per = row["batch_per_rank"] / one["batch_per_rank"]  # weak: 1; strong: 1 / W
        row["efficiency_interval"] = ((1.0, 1.0) if row is one else  # W = 1 against itself: 1 by definition
                                      (per * base["low"] / row["step"]["high"], per * base["high"] / row["step"]["low"]))
        row["speedup_interval"] = tuple(e * row["world_size"] for e in row["efficiency_interval"])


def throughput_ranking(rows: list[dict]) -> dict:
    """Which W trained the most samples per second, beyond the noise: the worlds ranked by time per sample
    (all ranks together), from each world's step-time spread. ``sentence`` names one only where the
    intervals separate (``dpteach.measure.ranking``)."""
    per_sample = {f"W={r['world_size']}": spread(t / (r["world_size"] * r["batch_per_rank"])
                                                 for t in r["step"]["samples"]) for r in rows}
    return ranking(per_sample).as_dict("µs per sample", scale=1e6, digits=1)
