"""Checkpoints (lesson 13, second half): resuming exactly, what a checkpoint costs, and how often to take one.

* ``resume_equivalence`` trains one run without a break, writing a checkpoint after ``stop_at`` steps as any
  run does, and resumes fresh trainers from that checkpoint - whole, then once with each piece of the
  state left out, and at another W if asked - and compares every final weight.
* ``checkpoint_cost`` times ``dcp.save`` against ``dcp.async_save`` on this machine, interleaved and repeated
  (``dpteach/measure.py``): bytes per rank, seconds the training loop is blocked, seconds until the
  checkpoint is on disk.
* ``checkpoint_interval`` finds the interval that loses least time for a failure rate, by Young's and
  Daly's formulas and by a simulated job with injected failures (``training/interval.py``).

The interruption of ``resume_equivalence`` is quiet and inside one launch: a fresh ``SyncTrainer``, with
fresh weights, optimizer and generators, loads the checkpoint the untouched run wrote at ``stop_at``. The
run that a failure would have stopped there is the untouched run's first ``stop_at`` steps, bit for bit, so
it is not trained a second time; every variant runs in one world (one start of the ranks, not one per
variant). A real kill and a real restart are ``failures.restart_run`` and the tests'.
"""
from __future__ import annotations

import itertools
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch.distributed as dist

from .. import validate
from ..measure import FEWEST_ROUNDS, interleaved, spread
from ..ranks import context
from ..ranks.launcher import launch
from ..ranks.world import resolve_world
from ..training import interval as ckpt_interval
from ..training.checkpoint import PIECES, RESUMABLE, checkpoint_bytes, step_name, training_state
from ..training.reference import exact_tolerance
from ..training.resumable import Checkpointing, train_resumable_on_rank
from ..training.train import SyncTrainer, TrainConfig


def _fresh_copy(checkpoint: str, target: Path) -> str:
    """A folder holding only ``checkpoint`` (a run's checkpoint at the step to resume from), for one resume."""
    if dist.get_rank() == 0:
        shutil.copytree(checkpoint, target / Path(checkpoint).name)
    dist.barrier()
    return str(target)


class _Progress:
    """Rank 0 advances the launcher's progress bar one run at a time, naming the run it starts."""

    def __init__(self, total: int, strategy: str):
        self.total, self.strategy, self.done = total, strategy, -1

    def next(self, name: str) -> None:
        self.done += 1
        if dist.get_rank() == 0:
            context.report_progress(1 if self.done else 0, total=self.total,
                                    desc=f"{self.strategy}: run {min(self.done + 1, self.total)} of {self.total}, {name}")


def _checkpointed(config: TrainConfig, folder: Path, stop_at: int) -> tuple[dict, str]:
    """``config`` trained untouched, writing a checkpoint at ``stop_at`` (and at the end), as any run would; returns
    its summary and the path of that checkpoint, from which fresh trainers resume."""
    run = train_resumable_on_rank(config, Checkpointing(str(folder), every=stop_at, keep=config.steps))
    return run, next(c["path"] for c in run["checkpoints"] if c["path"].endswith(step_name(stop_at)))


def _runs_on_rank(config: TrainConfig, stop_at: int, leave_out: tuple, folder: str, plain: TrainConfig | None) -> dict:
    """Every variant at this W, in one world: untouched (writing its checkpoint at ``stop_at``), then fresh trainers
    resumed from that checkpoint, whole and without each piece; with ``plain``, also that config untouched (its
    checkpoint at ``stop_at`` is resumed at another W)."""
    root = Path(folder)
    progress = _Progress(2 + len(leave_out) + (plain is not None), config.strategy)
    progress.next("untouched")
    untouched, saved = _checkpointed(config, root / "untouched", stop_at)
    runs = {"untouched": untouched}
    plain_saved = None
    if plain is not None:
        progress.next("untouched in fp32 without noise")
        runs["untouched, plain"], plain_saved = _checkpointed(plain, root / "plain-untouched", stop_at)
    for missing in [()] + [(piece,) for piece in leave_out]:
        name = "resumed" if not missing else f"without {missing[0]}"
        progress.next(name)
        directory = _fresh_copy(saved, root / name.replace(" ", "-"))
        runs[name] = train_resumable_on_rank(config, Checkpointing(directory, every=config.steps, leave_out=missing))
    progress.next("done")
    keep = ("params", "losses", "resumed_from", "restored", "replica_spread", "precision")
    return {"runs": {name: {k: run.get(k) for k in keep} for name, run in runs.items()},
            "checkpoint": untouched["checkpoints"][0], "plain_saved": plain_saved}


def _resume_elsewhere_on_rank(config: TrainConfig, saved: str, folder: str) -> dict:
    if dist.get_rank() == 0:
        context.report_progress(0, total=1, desc=f"resumed at W={dist.get_world_size()}")
    directory = _fresh_copy(saved, Path(folder) / "resumed-at-new-W")
    run = train_resumable_on_rank(config, Checkpointing(directory, every=config.steps))
    if dist.get_rank() == 0:
        context.report_progress(1)
    return {k: run.get(k) for k in ("params", "losses", "resumed_from", "restored", "saved_world_size")}


def resume_equivalence(strategy: str = "ddp", world_size: int | None = 2, steps: int = 8, stop_at: int = 4,
                       resume_world_size: int | None = None, leave_out=PIECES, optimizer: str = "sgd",
                       precision: str | None = None, input_noise: float = 0.1, init_scale: float = 2.0**20,
                       growth_interval: int = 3, backend: str = "auto", device: str = "auto",
                       timeout: float = 300.0) -> dict:
    """Untouched against interrupted-and-resumed, on the mlp, at ``world_size`` ranks (and resumed at
    ``resume_world_size`` too, with the same global batch). Eight steps, resumed after four, are the fewest at
    which every piece left out shows in the weights for every strategy (the scaler's scale has grown by then:
    ``growth_interval`` 3). Input noise and, where the strategy takes it
    (``precision=None``: the replicated ones), fp16 with a small ``growth_interval`` make every piece of the
    state matter, so that leaving any one out shows; the sharded strategies run in fp32, without a scaler.

    Returns ``{"strategy", "world_size", "steps", "stop_at", "tolerance", "runs": {name: {"losses",
    "max_abs_diff", "equal", "resumed_from", "restored"}}, "checkpoint": {"bytes", "seconds"}}``: ``equal``
    is bit for bit at the same W and within the strategy's ``tolerance`` at another W (where the run compared is
    the same one in fp32 without input noise: a rank's noise stream cannot follow a change of W). ``loss_gap``:
    each step's loss after the resume minus the untouched run's.
    """
    validate.choice("strategy", strategy, RESUMABLE)
    validate.integer("steps", steps, low=2, high=200)
    validate.integer("stop_at", stop_at, low=1, high=steps - 1)
    leave_out = tuple(leave_out)
    for piece in leave_out:
        validate.choice("leave_out", piece, PIECES)
    world = resolve_world(world_size, backend, device)
    global_batch = 32 * world.size
    config = TrainConfig(strategy=strategy, model="mlp", steps=steps, batch_per_rank=32, optimizer=optimizer,
                         precision=precision or "fp16", input_noise=input_noise, init_scale=init_scale,
                         growth_interval=growth_interval, timing_warmup=0)
    if precision is None:  # fp16 where the strategy takes it (its loss scaler is then state too), else fp32
        try:
            config.check(world)
        except ValueError:
            config = replace(config, precision="fp32")
    config.check(world)
    if config.precision != "fp16":
        leave_out = tuple(piece for piece in leave_out if piece != "scaler")  # no scaler to leave out
    plain = None
    if resume_world_size is not None:
        validate.integer("resume_world_size", resume_world_size, low=1, high=8)
        if global_batch % resume_world_size:
            raise ValueError(f"resume_world_size={resume_world_size!r} is not allowed: the global batch of "
                             f"{global_batch} samples must split evenly over the new ranks; choose a divisor of it")
        # Per-rank noise streams cannot follow a change of W, and fp16's skips could flip on a rounding: the
        # resume at another W is compared on the same run in fp32 without noise.
        plain = replace(config, input_noise=0.0, precision="fp32").check(world)
        elsewhere = replace(plain, batch_per_rank=global_batch // resume_world_size).check(resume_world_size)
    with tempfile.TemporaryDirectory(prefix="dpteach-resume-") as folder:
        here = launch(_runs_on_rank, world, args=(config, stop_at, leave_out, folder, plain), timeout=timeout)[0]
        runs = here["runs"]
        if resume_world_size is not None:
            moved = launch(_resume_elsewhere_on_rank, resume_world_size, args=(elsewhere, here["plain_saved"], folder),
                           backend=backend, device=device, timeout=timeout)[0]
            runs[f"resumed at W={resume_world_size}"] = moved
    plain_base = runs.pop("untouched, plain", None)
    tolerance = exact_tolerance(plain or config)
    rows = {}
    for name, run in runs.items():
        elsewhere_run = name.startswith("resumed at W=")
        base = plain_base if elsewhere_run else runs["untouched"]
        diff = (run["params"] - base["params"]).abs().max().item()
        start = run["resumed_from"]
        gap = [a - b for a, b in zip(run["losses"], base["losses"][start:])]
        rows[name] = {"losses": run["losses"], "loss_gap": gap, "max_abs_diff": diff, "resumed_from": run["resumed_from"],
                      "restored": run["restored"], "equal": diff <= tolerance if elsewhere_run else diff == 0.0,
                      "skipped_steps": sum((run.get("precision") or {}).get("skipped") or [])}
    return {"strategy": strategy, "world_size": world.size, "resume_world_size": resume_world_size, "steps": steps,
            "stop_at": stop_at, "precision": config.precision, "input_noise": input_noise, "tolerance": tolerance,
            "runs": rows, "checkpoint": {k: here["checkpoint"][k] for k in ("bytes", "seconds")}}


def _drop(path: str) -> None:
    """A timed checkpoint, once written (every rank's part is on disk when the save returns), is not kept."""
    if dist.get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)


def _cost_on_rank(configs: list, rounds: int, folder: str) -> list[dict]:
    """Every strategy in this one world: its state after two steps, then ``rounds`` interleaved rounds (one
    untimed first) of ``dcp.save`` and ``dcp.async_save``, the order swapped every round."""
    import torch.distributed.checkpoint as dcp
    rank, out = dist.get_rank(), []
    for k, config in enumerate(configs):
        if rank == 0:
            context.report_progress(0, total=len(configs), desc=f"checkpoint cost: {config.strategy}")
        trainer = SyncTrainer(config)
        for step in range(2):  # the optimizer has its state, as in a real checkpoint
            trainer.step(step)
        state = training_state(trainer, 2)
        dcp.save(state, checkpoint_id=f"{folder}/{k}-bytes")  # what each rank writes (and an untimed first save)
        dist.barrier()
        written = Path(folder) / f"{k}-bytes"
        rank_bytes = sum(f.stat().st_size for f in written.glob(f"__{rank}_*"))
        total_bytes = checkpoint_bytes(written) if rank == 0 else None
        times = {"sync_s": [], "async_blocked_s": [], "async_total_s": []}
        saves = itertools.count()

        def sync():
            path = f"{folder}/{k}-sync-{next(saves)}"
            dist.barrier()
            start = time.perf_counter()
            dcp.save(state, checkpoint_id=path)
            times["sync_s"].append(time.perf_counter() - start)
            _drop(path)

        def asynchronous():
            path = f"{folder}/{k}-async-{next(saves)}"
            dist.barrier()
            start = time.perf_counter()
            future = dcp.async_save(state, checkpoint_id=path)
            times["async_blocked_s"].append(time.perf_counter() - start)  # the loop could train again from here
            future.result()
            times["async_total_s"].append(time.perf_counter() - start)
            _drop(path)
        interleaved({"sync": sync, "async": asynchronous}, rounds=rounds)  # the samples are kept above
        out.append({**{name: samples[-rounds:] for name, samples in times.items()},  # the untimed round dropped
                    "rank_bytes": rank_bytes, "total_bytes": total_bytes})
        if rank == 0:
            context.report_progress(1)
    return out


def checkpoint_cost(strategies=("ddp", "zero2"), model: str = "mlp", world_size: int | None = 2,
                    optimizer: str = "adam", rounds: int = 8, backend: str = "auto", device: str = "auto",
                    timeout: float = 300.0) -> dict:
    """What one checkpoint costs here, per strategy, all in one world: ``rounds`` interleaved rounds of a
    synchronous save (``dcp.save``) and an asynchronous one (``dcp.async_save``: blocked only while the state
    is staged, written by a background thread), each a median with its interval (``dpteach.measure``); a round's
    time is the slowest rank's. Eight rounds are the fewest whose interval leaves out the slowest and the fastest
    round (``measure.median_interval_ranks``), so one round caught by a burst of load elsewhere cannot decide
    the comparison. ``rank_bytes`` is what each rank wrote: the state DDP's ranks hold alike is
    written once, shared out among the ranks by DCP's planner; a sharded strategy's ranks write their own.

    Returns ``{"model", "optimizer", "world_size", "rounds", "rows": [{"strategy", "sync_s", "async_blocked_s",
    "async_total_s" (medians, seconds), "spreads": {the same three: Spread.as_dict()}, "blocked_less"
    (async_save's blocked interval wholly below dcp.save's), "rank_bytes", "total_bytes"}]}``."""
    for strategy in strategies:
        validate.choice("strategies", strategy, RESUMABLE)
    validate.integer("rounds", rounds, low=FEWEST_ROUNDS, high=20,
                     why=" (fewer rounds give no interval for the median, dpteach/measure.py)")
    world = resolve_world(world_size, backend, device)
    configs = [TrainConfig(strategy=strategy, model=model, steps=2, optimizer=optimizer).check(world)
               for strategy in strategies]
    with tempfile.TemporaryDirectory(prefix="dpteach-cost-") as folder:
        per_rank = launch(_cost_on_rank, world, args=(configs, rounds, folder), timeout=timeout)
    rows = []
    for k, strategy in enumerate(strategies):
        mine = [r[k] for r in per_rank]
        spreads = {name: spread([max(r[name][i] for r in mine) for i in range(rounds)])
                   for name in ("sync_s", "async_blocked_s", "async_total_s")}
        rows.append({"strategy": strategy, **{name: s.median for name, s in spreads.items()},
                     "spreads": {name: s.as_dict() for name, s in spreads.items()},
                     "blocked_less": spreads["async_blocked_s"].below(spreads["sync_s"]),
                     "rank_bytes": [r["rank_bytes"] for r in mine], "total_bytes": mine[0]["total_bytes"]})
    return {"model": model, "optimizer": optimizer, "world_size": world.size, "rounds": rounds, "rows": rows}


def checkpoint_interval(gpus: int = 16384, gpu_mtbf_hours: float | None = None, checkpoint_s: float = 60.0,
                        restart_s: float = 600.0, points: int = 15, failures: int = 1000, seed: int = 0) -> dict:
    """The best checkpoint interval for a job of ``gpus`` GPUs each failing every ``gpu_mtbf_hours`` on
    average (default: the rate the Llama 3 report implies), ``checkpoint_s`` per checkpoint and
    ``restart_s`` per restart: Young's and Daly's intervals, the fraction of time lost at each interval of
    a sweep by the first-order formula, by Daly's exact expectation and by a simulated job."""
    mtbf_hours = ckpt_interval.llama3_gpu_mtbf_hours() if gpu_mtbf_hours is None else gpu_mtbf_hours
    mtbf = ckpt_interval.job_mtbf_s(gpus, mtbf_hours)
    validate.number("checkpoint_s", checkpoint_s, above=0, unit="seconds")
    validate.number("restart_s", restart_s, low=0, unit="seconds")
    validate.integer("points", points, low=3, high=60)
    validate.integer("failures", failures, low=10, high=5000)
    young = ckpt_interval.young_interval(checkpoint_s, mtbf)
    daly = ckpt_interval.daly_interval(checkpoint_s, mtbf)
    sweep = [young * 2 ** (k * 6 / (points - 1) - 3) for k in range(points)]  # young/8 .. young*8
    rows = []
    for i, tau in enumerate(sweep):
        simulated = ckpt_interval.simulate_fraction_lost(tau, checkpoint_s, restart_s, mtbf, failures, seed + i)
        rows.append({"interval_s": tau, "simulated": simulated["fraction_lost"], "failures": simulated["failures"],
                     "expected": ckpt_interval.expected_fraction_lost(tau, checkpoint_s, restart_s, mtbf),
                     "first_order": ckpt_interval.first_order_fraction_lost(tau, checkpoint_s, restart_s, mtbf)})
    best = min(rows, key=lambda r: r["simulated"])
    return {"gpus": gpus, "gpu_mtbf_hours": mtbf_hours, "job_mtbf_s": mtbf, "checkpoint_s": checkpoint_s,
            "restart_s": restart_s, "young_s": young, "daly_s": daly,
            "lost_at_young": ckpt_interval.expected_fraction_lost(young, checkpoint_s, restart_s, mtbf),
            "lost_at_daly": ckpt_interval.expected_fraction_lost(daly, checkpoint_s, restart_s, mtbf),
            "simulated_best_s": best["interval_s"], "rows": rows}
