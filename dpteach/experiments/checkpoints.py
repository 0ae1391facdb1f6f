"""Checkpoints (lesson 13, second half): resuming exactly, what a checkpoint costs, and how often to take one.

* ``resume_equivalence`` trains one run without a break, and the same run interrupted after
  ``stop_at`` steps and resumed from its checkpoint by a fresh trainer - whole, then once with each
  piece of the state left out, and at another W if asked - and compares every final weight.
* ``checkpoint_cost`` times ``dcp.save`` against ``dcp.async_save`` on this machine: bytes per rank,
  seconds the training loop is blocked, seconds until the checkpoint is on disk.
* ``checkpoint_interval`` finds the interval that loses least time for a failure rate, by Young's and
  Daly's formulas and by a simulated job with injected failures (``training/interval.py``).

The interruption of ``resume_equivalence`` is a quiet stop inside one launch (a fresh ``SyncTrainer``
then loads the checkpoint, with fresh weights, optimizer and generators), so that every variant runs in
one world; a real kill and a real restart are ``failures.restart_run`` and the tests'.
"""
from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch.distributed as dist

from .. import validate
from ..ranks.launcher import launch
from ..ranks.world import resolve_world
from ..training import interval as ckpt_interval
from ..training.checkpoint import PIECES, RESUMABLE, checkpoint_bytes, training_state
from ..training.reference import exact_tolerance
from ..training.resumable import Checkpointing, train_resumable_on_rank
from ..training.train import SyncTrainer, TrainConfig


def _fresh_copy(source: Path, target: Path) -> str:
    if dist.get_rank() == 0:
        shutil.copytree(source, target)
    dist.barrier()
    return str(target)


def _runs_on_rank(config: TrainConfig, stop_at: int, leave_out: tuple, folder: str, plain: TrainConfig | None) -> dict:
    """Every variant at this W, in one world: untouched, interrupted and resumed (whole, then without each piece);
    with ``plain``, also that config untouched and interrupted (its checkpoint is resumed at another W)."""
    root = Path(folder)
    untouched = train_resumable_on_rank(config, Checkpointing(str(root / "untouched"), every=config.steps))
    interrupted = train_resumable_on_rank(config, Checkpointing(str(root / "interrupted"), every=stop_at),
                                          stop_after=stop_at)
    saved = root / "interrupted"
    runs = {"untouched": untouched}
    if plain is not None:
        runs["untouched, plain"] = train_resumable_on_rank(plain, Checkpointing(str(root / "plain-untouched"),
                                                                                every=plain.steps))
        train_resumable_on_rank(plain, Checkpointing(str(root / "plain-interrupted"), every=stop_at), stop_after=stop_at)
    for missing in [()] + [(piece,) for piece in leave_out]:
        name = "resumed" if not missing else f"without {missing[0]}"
        directory = _fresh_copy(saved, root / name.replace(" ", "-"))
        runs[name] = train_resumable_on_rank(config, Checkpointing(directory, every=config.steps, leave_out=missing))
    keep = ("params", "losses", "resumed_from", "restored", "replica_spread", "precision")
    return {"runs": {name: {k: run.get(k) for k in keep} for name, run in runs.items()},
            "checkpoint": interrupted["checkpoints"][-1]}


def _resume_elsewhere_on_rank(config: TrainConfig, saved: str, folder: str) -> dict:
    directory = _fresh_copy(Path(saved), Path(folder) / "resumed-at-new-W")
    run = train_resumable_on_rank(config, Checkpointing(directory, every=config.steps))
    return {k: run.get(k) for k in ("params", "losses", "resumed_from", "restored", "saved_world_size")}


def resume_equivalence(strategy: str = "ddp", world_size: int | None = 2, steps: int = 12, stop_at: int = 6,
                       resume_world_size: int | None = None, leave_out=PIECES, optimizer: str = "sgd",
                       precision: str | None = None, input_noise: float = 0.1, init_scale: float = 2.0**20,
                       growth_interval: int = 3, backend: str = "auto", device: str = "auto",
                       timeout: float = 300.0) -> dict:
    """Untouched against interrupted-and-resumed, on the mlp, at ``world_size`` ranks (and resumed at
    ``resume_world_size`` too, with the same global batch). Input noise and, where the strategy takes it
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
            saved = str(Path(folder) / "plain-interrupted")
            moved = launch(_resume_elsewhere_on_rank, resume_world_size, args=(elsewhere, saved, folder),
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


def _cost_on_rank(config: TrainConfig, repeats: int, folder: str) -> dict:
    import torch.distributed.checkpoint as dcp
    trainer = SyncTrainer(config)
    for step in range(2):  # the optimizer has its state, as in a real checkpoint
        trainer.step(step)
    state = training_state(trainer, 2)
    timings = {"sync_s": [], "async_blocked_s": [], "async_total_s": []}
    for i in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        dcp.save(state, checkpoint_id=f"{folder}/sync-{i}")
        timings["sync_s"].append(time.perf_counter() - start)
        dist.barrier()
        start = time.perf_counter()
        future = dcp.async_save(state, checkpoint_id=f"{folder}/async-{i}")
        timings["async_blocked_s"].append(time.perf_counter() - start)  # the loop could train again from here
        future.result()
        timings["async_total_s"].append(time.perf_counter() - start)
    dist.barrier()
    files = sorted(Path(f"{folder}/sync-0").glob(f"__{dist.get_rank()}_*"))
    return {**{k: statistics.median_high(v) for k, v in timings.items()},
            "rank_bytes": sum(f.stat().st_size for f in files),
            "total_bytes": checkpoint_bytes(f"{folder}/sync-0") if dist.get_rank() == 0 else None}


def checkpoint_cost(strategies=("ddp", "zero2"), model: str = "mlp", world_size: int | None = 2,
                    optimizer: str = "adam", repeats: int = 3, backend: str = "auto", device: str = "auto",
                    timeout: float = 300.0) -> dict:
    """What one checkpoint costs here, per strategy: the median of ``repeats`` saves, synchronous
    (``dcp.save``) and asynchronous (``dcp.async_save``: blocked only while the state is staged, written by
    a background thread). ``rank_bytes`` is what each rank wrote: the state DDP's ranks hold alike is
    written once, shared out among the ranks by DCP's planner; a sharded strategy's ranks write their own."""
    for strategy in strategies:
        validate.choice("strategies", strategy, RESUMABLE)
    validate.integer("repeats", repeats, low=1, high=20)
    world = resolve_world(world_size, backend, device)
    rows = []
    for strategy in strategies:
        config = TrainConfig(strategy=strategy, model=model, steps=2, optimizer=optimizer).check(world)
        with tempfile.TemporaryDirectory(prefix="dpteach-cost-") as folder:
            per_rank = launch(_cost_on_rank, world, args=(config, repeats, folder), timeout=timeout)
        rows.append({"strategy": strategy, "sync_s": max(r["sync_s"] for r in per_rank),
                     "async_blocked_s": max(r["async_blocked_s"] for r in per_rank),
                     "async_total_s": max(r["async_total_s"] for r in per_rank),
                     "rank_bytes": [r["rank_bytes"] for r in per_rank], "total_bytes": per_rank[0]["total_bytes"]})
    return {"model": model, "optimizer": optimizer, "world_size": world.size, "repeats": repeats, "rows": rows}


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
