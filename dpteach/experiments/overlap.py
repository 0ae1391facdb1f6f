"""``overlap_timeline``: where a data-parallel step spends its time, and which fix removes the idle part.

The course's central practice question: GPUs sit idle while gradients are exchanged, and the trained
model must stay exactly what single-process training would give. This experiment runs, in ONE world
(one start-up cost, same seed, same batches for every run):

* the four exact strategies - ``naive``, ``bucketed``, ``overlap`` and torch's ``ddp`` - whose
  timelines show *when* communication happens relative to backward;
* ``local`` (no communication at all), the compute floor: a strategy's *exposed* communication is
  the time its ranks waited for communication, measured where they waited (``timeline.exposed_time``),
  and whatever else its step adds above this floor is overhead (``dpteach/training/accounting.py``);
* the question's four candidate answers, each applied to the team's current set-up (``bucketed``:
  all-reduce after backward): overlap, 8-bit compression, accumulating 2 micro-batches, halving
  the batch. The accumulation and small-batch runs get their own ``local`` floor, because they do
  a different amount of compute per step.

Every run is compared with single-process training on the *original* recipe (B x W samples per
step, no accumulation): the requirement of the question. Only the exact strategies stay within
float32 rounding of it (``dpteach.training.reference.exact_tolerance``).

Timings are what this machine measured. On a CPU with fewer cores than ranks, gloo's communication
threads compete with backward for the same cores, so overlap hides little; on GPUs NCCL's kernels
share the SMs with backward but run beside it (lesson 04). With ``link`` (``dpteach/network/emulated.py``) every
collective takes as long as that network would, and the CPU is no longer the network. The
*structure* does not depend on the machine: ``naive`` and ``bucketed`` never start a transfer
before backward ends; ``overlap`` and ``ddp`` launch their first bucket while backward is running.

With ``peers="emulated"`` one real rank (the one GPU of most learners) trains, and the link times
every exchange as among ``world_size`` ranks (``dpteach.ranks.world``): the timelines and exposed
communication are those of the emulated world; whether the results stay exact is not shown (the
candidates' ``identical`` and every ``max_abs_diff_vs_single`` are None) - real ranks show that.
"""
from __future__ import annotations

import statistics
from dataclasses import replace

from .. import validate
from ..ranks.world import World
from ..replica.sizing import RunLoad
from ..replica.trace import save_trace
from ..sync import EXACT
from ..training.accounting import summarise_run, typical_step
from ..training.reference import exact_tolerance, train_single_process
from ..training.train import TrainConfig, train_each_on_rank
from ..training.prologue import set_up

TIMELINE_STRATEGIES = ("naive", "bucketed", "overlap", "ddp")

# The practice question's answers, each as a change to the current set-up (bucketed, K=1, batch B):
# (key, the answer in words, the run that tries it, the no-communication run with the same compute)
CANDIDATES = (
    ("today", "today: all-reduce after backward (bucketed)", "bucketed", "local"),
    ("overlap", "overlap the all-reduce with backward, bucket by bucket", "overlap", "local"),
    ("int8", "quantise gradients to 8 bits before sending", "int8", "local"),
    ("accumulate", "accumulate 2 micro-batches per step", "accumulate", "local_accumulate"),
    ("smaller_batch", "halve the global batch", "smaller_batch", "local_smaller_batch"),
)


def overlap_timeline(world_size: int | World | None = None, model: str = "auto", bucket_mb: float | None = None,
                     steps: int = 8, batch_per_rank: int | None = None, seed: int = 0, link=None, backend: str = "auto",
                     device: str = "auto", timeout: float = 600.0, peers: str | None = None, trace=None) -> dict:
    """Run the exact strategies and the question's candidate answers in one world; return plain data.

    ``link``: an emulated network for every collective (``dpteach.network.emulated``: a preset name, a ``Link`` or
    ``{"alpha_s", "beta_s_per_byte"}``); None is this machine's own transfers. ``model="auto"``: the tiny
    transformer on CPU ranks, a GPU-sized one on GPU ranks (``dpteach.replica.sizing``); ``batch_per_rank=None``:
    32 for a laptop model, the model's own for a GPU-sized one. ``peers="emulated"``: see the module note.
    ``trace``: a file to write every run's whole timeline to, for Perfetto (``dpteach/replica/trace.py``).

    Returns ``{"world_size", "backend", "device", "model", "model_choice", "peers", "peers_note",
    "bucket_mb", "link", "steps", "batch_per_rank", "tolerance", "timed_steps", "shown_steps": {strategy:
    step}, "strategies": [row per strategy], "timelines": {strategy: {rank: [spans of its typical step]}},
    "candidates": [row per answer], "reference_losses", "trace": the file written or None}``. Times are seconds; ``exposed_comm_s`` is the
    communication the ranks waited for, ``overhead_s`` the rest of the step above its compute floor.
    """
    validate.optional(validate.integer, "batch_per_rank", batch_per_rank, low=2)
    runs_in_world = 10
    setup = set_up(world_size, backend, device, peers, model=model, link=link, at_least=2,
                   why="overlap needs two ranks or more to talk", emulated_peers_ok=True,
                   load=lambda world: RunLoad(steps=runs_in_world * steps + (0 if world.emulated_size else
                                                                              steps * world.size),
                                              models_at_once=runs_in_world, cpu_model="transformer"))
    world, emulated = setup.world, setup.link
    base = TrainConfig(**setup.fields(batch_per_rank), steps=steps, bucket_mb=bucket_mb, seed=seed)
    half = max(1, base.batch_per_rank // 2)
    runs = {name: replace(base, strategy=name) for name in ("local", *TIMELINE_STRATEGIES, "int8")}
    runs.update({
        "local_accumulate": replace(base, strategy="local", accum_steps=2),
        "accumulate": replace(base, strategy="bucketed", accum_steps=2),
        "local_smaller_batch": replace(base, strategy="local", batch_per_rank=half),
        "smaller_batch": replace(base, strategy="bucketed", batch_per_rank=half),
    })
    names = list(runs)
    configs = [runs[n].check(world) for n in names]
    # interleave=True: step s of every run, then step s+1, so that a burst of background load on a
    # shared machine hits all runs alike and their differences stay meaningful.
    per_rank = setup.on_ranks(train_each_on_rank, configs, True, timeout=timeout)
    results = {n: [per_rank[r][i] for r in range(world.size)] for i, n in enumerate(names)}
    exact_shown = world.emulated_size is None  # one real rank shows no exactness: nothing was averaged
    reference = train_single_process(base, world.size, device=setup.reference_device) if exact_shown else None
    timed = range(min(base.timing_warmup, steps - 1), steps)

    floors = {name: statistics.mean(r["median_step_s"] for r in results[floor])
              for name, floor in (("local", "local"), ("naive", "local"), ("bucketed", "local"), ("overlap", "local"),
                                  ("ddp", "local"), ("int8", "local"), ("local_accumulate", "local_accumulate"),
                                  ("accumulate", "local_accumulate"), ("local_smaller_batch", "local_smaller_batch"),
                                  ("smaller_batch", "local_smaller_batch"))}
    summaries = {name: summarise_run(results[name], timed, floors[name], runs[name].strategy) for name in names}
    for name, summary in summaries.items():
        summary["max_abs_diff_vs_single"] = ((results[name][0]["params"] - reference["params"]).abs().max().item()
                                             if exact_shown else None)
        summary["final_loss"] = results[name][0]["losses"][-1]

    tolerance = exact_tolerance(base)
    strategies = [{"strategy": name, **summaries[name], "exact": name in EXACT}
                  for name in ("local", *TIMELINE_STRATEGIES, "int8")]
    candidates = []
    for key, answer, run, floor in CANDIDATES:
        summary, config = summaries[run], runs[run]
        samples = config.global_batch(world.timed_size)
        diff = summary["max_abs_diff_vs_single"]
        candidates.append({
            "key": key, "answer": answer, "strategy": config.strategy, "accum_steps": config.accum_steps,
            "batch_per_rank": config.batch_per_rank, "samples_per_step": samples,
            "step_time_s": summary["step_time_s"], "exposed_comm_s": summary["exposed_comm_s"],
            "overhead_s": summary["overhead_s"], "exposed_comm_per_sample_s": summary["exposed_comm_s"] / samples,
            "messages_per_step": summary["messages"], "bytes_per_step": summary["bytes_per_step"],
            "max_abs_diff_vs_single": diff, "identical": None if diff is None else diff <= tolerance,
        })
    shown = {name: typical_step(results[name][0]["step_times"], timed) for name in ("local", *TIMELINE_STRATEGIES)}
    timelines = {name: {r: [s for s in results[name][r]["spans"] if s["step"] == shown[name]]
                        for r in range(world.size)} for name in shown}
    return {**setup.facts, "bucket_mb": base.bucket_mb, "link": None if emulated is None else emulated.as_dict(),
            "steps": steps, "batch_per_rank": base.batch_per_rank,
            "tolerance": tolerance, "timed_steps": list(timed), "shown_steps": shown,
            "strategies": strategies, "timelines": timelines, "candidates": candidates,
            "reference_losses": reference["losses"] if exact_shown else None,
            "trace": save_trace(trace, results, world.device_type, about=setup.facts)}
