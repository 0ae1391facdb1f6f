"""How often to checkpoint: the interval that loses the least time, by formula and by simulation.

A job on ``W`` GPUs fails whenever any one of them does, so its mean time between failures is the
GPU's divided by W: ``M = MTBF_gpu / W``. Checkpoint every ``tau`` seconds of work, at a cost of ``C``
seconds each, and a failure throws away the work since the last checkpoint (on average about
``tau / 2``) plus the ``R`` seconds a restart takes. Checkpointing often wastes ``C`` many times;
rarely, a failure wastes much. The two balance at::

    tau_Young = sqrt(2 C M)                               Young, CACM 17(9), 1974
    tau_Daly  = sqrt(2 C M) (1 + sqrt(C / 2M) / 3 + (C / 2M) / 9) - C      (C < 2M; else M)
                                                          Daly, Future Gener. Comput. Syst. 22(3), 2006

and first order, the fraction of time lost is ``C / tau + tau / 2M`` (+ ``R / M``). For failures that
arrive at random (exponentially distributed gaps), Daly's paper gives the expected wall time of ``T``
seconds of work exactly, ``M e^(R/M) (e^((tau + C)/M) - 1) T / tau``, which ``expected_fraction_lost``
uses; ``simulate_fraction_lost`` checks it by running a job with injected failures, event by event.

At scale the numbers are not small: the Llama 3 report (Dubey et al., "The Llama 3 Herd of Models",
2024, section 3.3.4) counts 419 unexpected interruptions in a 54-day snapshot of pre-training on up to
16,384 H100 GPUs - one about every three hours.
"""
from __future__ import annotations

import math
import random

from .. import validate

# Dubey et al. 2024, section 3.3.4: a 54-day snapshot of Llama 3 405B pre-training on 16,384 H100s.
LLAMA3 = {"unexpected_interruptions": 419, "days": 54, "gpus": 16384}


def llama3_gpu_mtbf_hours() -> float:
    """One GPU's mean time between failures implied by the Llama 3 report, counting every unexpected
    interruption as one GPU's failure (an upper bound on the failure rate of a GPU alone)."""
    return LLAMA3["days"] * 24 * LLAMA3["gpus"] / LLAMA3["unexpected_interruptions"]


def job_mtbf_s(gpus: int, gpu_mtbf_hours: float) -> float:
    validate.integer("gpus", gpus, low=1)
    validate.number("gpu_mtbf_hours", gpu_mtbf_hours, above=0, unit="hours")
    return gpu_mtbf_hours * 3600 / gpus


def young_interval(checkpoint_s: float, mtbf_s: float) -> float:
    return math.sqrt(2 * checkpoint_s * mtbf_s)


def daly_interval(checkpoint_s: float, mtbf_s: float) -> float:
    if checkpoint_s >= 2 * mtbf_s:
        return mtbf_s
    ratio = checkpoint_s / (2 * mtbf_s)
    return math.sqrt(2 * checkpoint_s * mtbf_s) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - checkpoint_s


def first_order_fraction_lost(interval_s: float, checkpoint_s: float, restart_s: float, mtbf_s: float) -> float:
    return checkpoint_s / interval_s + interval_s / (2 * mtbf_s) + restart_s / mtbf_s


def expected_fraction_lost(interval_s: float, checkpoint_s: float, restart_s: float, mtbf_s: float) -> float:
    """1 - work / expected wall time, for exponentially distributed failures (Daly 2006, the exact model)."""
    exponent = (interval_s + checkpoint_s) / mtbf_s
    if exponent > 700:  # a segment almost never completes: all time is lost
        return 1.0
    wall_per_work = mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1(exponent) / interval_s
    return 1 - 1 / wall_per_work


def simulate_fraction_lost(interval_s: float, checkpoint_s: float, restart_s: float, mtbf_s: float,
                           failures: int = 300, seed: int = 0) -> dict:
    """Run a job of work segments (``interval_s`` of work, then a checkpoint of ``checkpoint_s``) until about
    ``failures`` failures have struck; each failure loses the segment in progress and costs a restart of
    ``restart_s`` (itself interrupted if a failure strikes during it). Gaps between failures are drawn
    from an exponential distribution of mean ``mtbf_s``. Returns the fraction of wall time lost."""
    rng = random.Random(seed)
    work_target = failures * mtbf_s
    work = wall = 0.0
    seen = 0
    while work < work_target:
        segment = interval_s + checkpoint_s
        gap = rng.expovariate(1 / mtbf_s)
        if gap >= segment:
            wall += segment
            work += interval_s
            continue
        wall += gap  # the failure: this segment's work is gone
        seen += 1
        while True:  # restart; a failure during the restart starts it again
            gap = rng.expovariate(1 / mtbf_s)
            if gap >= restart_s:
                wall += restart_s
                break
            wall += gap
            seen += 1
    return {"fraction_lost": 1 - work / wall, "failures": seen, "wall_s": wall}
