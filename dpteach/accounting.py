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
"""
from __future__ import annotations

import statistics

from .sync import strategy_class
from .timeline import OVERHEAD_SPANS


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
    parts = {name: statistics.mean(r.get("median_overhead_s", {}).get(name, 0.0) for r in ranks)
             for name in OVERHEAD_SPANS}
    parts = {name: value for name, value in parts.items() if value > 0}
    parts["other"] = max(0.0, overhead - sum(parts.values()))
    return {**out, "overhead_s": overhead, "overhead_parts": parts}
