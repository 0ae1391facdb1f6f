"""Where a data-parallel step's time goes: compute, communication waited for, and overhead, by name.

A run of strategy S and a run of ``local`` (the same per-rank work with no communication) in the same
world give, per step (medians over the timed steps, averaged over the ranks)::

    step(S)  =  step(local)            the compute floor: forward, backward, optimizer
             +  exposed communication  measured: the time S's compute stood still waiting for it
                                       (``timeline.exposed_time``: its ``wait`` spans and blocking calls)
             +  overhead               the rest: named spans (packing buckets, unpacking, compressing,
                                       decompressing) and "other" - launching collectives, hooks,
                                       synchronisation, and compute slowed down by communication that
                                       shares its cores (CPU) or its SMs and memory (GPU)

Measuring the wait, rather than taking everything above the floor as communication, is what keeps a
one-rank run honest: with nothing to send it waits for nothing, and whatever it still costs above
``local`` is overhead. One strategy cannot be measured that way: torch's FSDP2 waits inside its own
hooks; for it the exposed communication is the step minus the floor, and the row says so.

Below that split, what every lesson reads off a run in the same way, so that no lesson borrows it from
another's module: the emulated link's account over the ranks (``link_report``), one step's structure
and the step worth drawing (``step_structure``, ``typical_step``), a run summarised (``summarise_run``),
and the collectives a region issued as torch's profiler saw them (``profiled``).
"""
from __future__ import annotations

import re
import statistics

from ..measure import spread
from ..replica.timeline import busy_time, exposed_time
from ..sync import strategy_class


def step_costs(strategy: str, ranks: list[dict], floor_step_s: float | None) -> dict:
    """The split of ``strategy``'s step from its per-rank results (``train_on_rank``'s summaries) against
    the compute floor ``floor_step_s`` (None: no floor was measured, so no overhead either)."""
    step = statistics.mean(r["median_step_s"] for r in ranks)
    measured = strategy_class(strategy).measures_exposure
    if measured:
        exposed = statistics.mean(r.get("median_exposed_s", 0.0) for r in ranks)
    else:
        exposed = None if floor_step_s is None else max(0.0, step - floor_step_s)
    out = {"step_time_s": step, "exposed_comm_s": exposed,
           "exposed_how": "measured wait" if measured else "step minus local"}
    if floor_step_s is None or exposed is None:
        return {**out, "overhead_s": None, "overhead_parts": None}
    overhead = max(0.0, step - floor_step_s - exposed)
    names = dict.fromkeys(name for r in ranks for name in r.get("median_overhead_s", {}))  # as the strategy named them
    parts = {name: statistics.mean(r.get("median_overhead_s", {}).get(name, 0.0) for r in ranks) for name in names}
    parts = {name: value for name, value in parts.items() if value > 0}
    parts["other"] = max(0.0, overhead - sum(parts.values()))
    return {**out, "overhead_s": overhead, "overhead_parts": parts}


# -- what a run's ranks report, summarised: the lessons' common reading of a run ---------------------------

def link_report(ranks: list[dict]) -> dict | None:
    """The emulated link's account over all ranks: the worst rank's share of machine-bound messages."""
    reports = [r.get("link") for r in ranks if r.get("link") and r["link"]["messages"]]
    if not reports:
        return None
    worst = max(reports, key=lambda rep: rep["machine_bound_share"])
    steps = len(ranks[0]["step_times"]) or 1
    return {"messages_per_step": worst["messages"] / steps, "link_seconds_per_step": worst["link_seconds"] / steps,
            "machine_bound_share": worst["machine_bound_share"], "time_set_by": worst["time_set_by"],
            # on GPU ranks: how far the link's spins on its stream were from the link's times (median, relative)
            "emulation_error": max((r.get("emulation_error") or 0.0 for r in reports), default=0.0)}


def comm_time(spans: list[dict]) -> float:
    """The time this rank's collectives were in flight, summed over the collectives (two buckets on the wire
    at once count twice): what the communication threads of its trace add up to (``replica/trace.py``)."""
    return sum(s["end"] - s["start"] for s in spans if s["lane"] == "comm")


def _intervals(spans, lane=None, names=None):
    return sorted((s["start"], s["end"]) for s in spans
                  if (lane is None or s["lane"] == lane) and (names is None or s["name"] in names))


def step_structure(spans: list[dict], step: int) -> dict:
    """What one rank did in one step: messages sent, time with a transfer in flight, and when they began.

    ``launch_lead_s`` is how long before the end of the (last) backward the first transfer started:
    negative when communication waits for backward to finish, positive when it overlaps it. (How much
    communication was *hidden* is read from step times instead: DDP waits for its last bucket inside
    backward, so comm spans lying under the backward span are not proof of useful overlap.)
    """
    mine = [s for s in spans if s["step"] == step]
    comm = _intervals(mine, lane="comm")
    backward = _intervals(mine, names=("backward",))
    backward_end = max((end for _, end in backward), default=0.0)
    return {
        "messages": len(comm),
        "comm_s": busy_time(mine, "comm"),
        "launch_lead_s": (backward_end - comm[0][0]) if comm else None,
        "backward_s": sum(end - start for start, end in backward),
    }


def typical_step(step_times: list[float], timed: range) -> int:
    """The timed step whose duration is the median: the one worth drawing on a noisy machine."""
    ordered = sorted(timed, key=lambda s: step_times[s])
    return ordered[len(ordered) // 2]


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarise_run(ranks: list[dict], steps: range, floor_step_s: float | None = None, strategy: str = "local") -> dict:
    """Per-step structure, median over the timed steps, mean over ranks; with ``floor_step_s`` (the
    compute floor's step) also the step's split into exposed communication and overhead."""
    per_rank = []
    for result in ranks:
        rows = [step_structure(result["spans"], s) for s in steps]
        per_rank.append({key: _median([row[key] for row in rows]) for key in rows[0]})
    out = {}
    for key in per_rank[0]:
        values = [row[key] for row in per_rank if row[key] is not None]
        out[key] = statistics.mean(values) if values else None
    out.update(step_costs(strategy, ranks, floor_step_s))
    out["bytes_per_step"] = statistics.mean(r["wire_bytes_per_step"] for r in ranks)
    out["time_set_by"] = (link_report(ranks) or {}).get("time_set_by")  # None without an emulated link
    out["replicas_identical"] = all(r["replica_spread"] == 0.0 for r in ranks)
    out["starts_before_backward_ends"] = all(
        (step_structure(r["spans"], s)["launch_lead_s"] or 0.0) > 0 for r in ranks for s in steps)
    out["spread"] = step_spreads(ranks, steps, strategy)
    return out


def step_spreads(ranks: list[dict], steps: range, strategy: str = "local") -> dict:
    """The timed steps as the rounds of a measurement (``dpteach.measure``): each step's time, and where it is
    measured its exposed communication, averaged over the ranks, then the median and its interval. Runs
    trained side by side (``train_each_on_rank(..., interleave=True)``) take their steps in turn, so step s
    of every run saw the same moment of the machine: the intervals of two such runs can be compared."""
    out = {"step_s": spread([statistics.mean(r["step_times"][s] for r in ranks) for s in steps]).as_dict()}
    if strategy_class(strategy).measures_exposure:
        out["exposed_s"] = spread([statistics.mean(exposed_time([x for x in r["spans"] if x["step"] == s])
                                                   for r in ranks) for s in steps]).as_dict()
    return out


# -- the collectives a region issued, as torch's profiler saw them ------------------------------------

_COLLECTIVE_EVENT = re.compile(r"^(?:gloo|nccl|ucc|mpi|xccl):(\w+)$")


def collectives_in(prof) -> list[str]:
    """Names of the collectives a profiled region issued, e.g. ``["all_reduce", "broadcast"]``."""
    return [m.group(1) for m in (_COLLECTIVE_EVENT.match(event.name) for event in prof.events()) if m]


def profiled(work) -> tuple[object, list[str]]:
    """Run ``work()`` under torch's profiler; return its result and the collectives it issued."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        result = work()
    return result, collectives_in(prof)
