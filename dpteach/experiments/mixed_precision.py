"""Mixed precision with data parallelism (lesson 12), measured on real ranks.

* ``precision_drift`` trains ``ddp`` in fp32, under bf16 autocast and under fp16 autocast with a
  loss scale, side by side on the same batches, and reports how far each ends from the fp32 run,
  what a rank holds (the fp32 parameters, gradients and optimizer state: the same in all three)
  and what one forward pass saves for backward (measured from the saved tensors).
* ``loss_scaling`` follows fp16's dynamic loss scale step by step - the skipped steps, the halving,
  the growth - and shows what clipping does when it is applied before unscaling instead of after.
* ``comm_precision`` sends DDP's gradients in fp32, bf16 and fp16 (a communication hook, as torch's
  ``bf16_compress_hook``) and reports the bytes per step and the drift each costs.

``dpteach/replica/precision.py`` holds the mechanics; these functions only choose runs and compare them.
"""
from __future__ import annotations

import statistics
from dataclasses import replace

import torch
from torch.nn.utils import parameters_to_vector

from .. import validate
from ..measure import spread
from ..ranks.backend import plain_fp32
from ..ranks.gpus import sixteen_bit_on
from ..ranks.launcher import launch
from ..ranks.world import World
from ..replica.build import OPTIMIZERS
from ..replica.data import loss_fn, make_dataset, sample_batch
from ..replica.models import SPECS, build_model
from ..replica.precision import PRECISIONS, saved_for_backward
from ..replica.sizing import RunLoad, check_model
from ..training.reference import exact_tolerance, reference_device, train_single_process
from ..training.train import TrainConfig, train_each_on_rank
from ..training.prologue import set_up


def _load(runs: int, steps: int, optimizer: str, reference: bool):
    """What ``runs`` runs side by side ask of a world (plus the single-process reference, if one is trained)."""
    return lambda world: RunLoad(steps=runs * steps + (steps * world.size if reference else 0), models_at_once=runs,
                                 optimizer=optimizer, cpu_model="mlp", batch_per_rank=32)


def _side_by_side(world: World, configs: dict, timeout: float) -> dict:
    """Train every config in one world, step by step side by side (fair timing); name -> rank 0's run
    plus whether every rank ended with the same weights."""
    checked = [config.check(world.size) for config in configs.values()]
    per_rank = launch(train_each_on_rank, world, args=(checked, True), timeout=timeout)
    runs = {}
    for i, (name, config) in enumerate(zip(configs, checked)):
        timed = range(min(config.timing_warmup, config.steps - 1), config.steps)
        runs[name] = {**per_rank[0][i], "replicas_identical": all(rank[i]["replica_spread"] == 0.0 for rank in per_rank),
                      "bytes_per_step": max(rank[i]["wire_bytes_per_step"] for rank in per_rank),
                      # the timed steps as the rounds of a measurement (averaged over the ranks): step s of every
                      # run was taken in turn, so two runs' intervals can be compared (dpteach.measure)
                      "step_spread": spread([statistics.mean(rank[i]["step_times"][s] for rank in per_rank)
                                             for s in timed]).as_dict()}
    return runs


def _drift(params: torch.Tensor, baseline: torch.Tensor, start: torch.Tensor) -> dict:
    """How far ``params`` ended from ``baseline``: the largest element, and the distance relative to
    how far the baseline itself moved from ``start`` (0: the same run; 1: as far as training went)."""
    gap = params - baseline
    return {"max_abs_diff_vs_fp32": gap.abs().max().item(),
            "relative_drift": (gap.norm() / (baseline - start).norm()).item()}


def _start(model: str, seed: int, device: str = "cpu") -> torch.Tensor:
    """The weights every run starts from (drawn where the ranks draw them), as one vector on the CPU."""
    return parameters_to_vector(build_model(model, seed=seed, device=device).parameters()).detach().cpu()


def _checked(model, optimizer, steps, low=2):
    check_model(model)
    validate.choice("optimizer", optimizer, OPTIMIZERS)
    validate.integer("steps", steps, low=low)


def precision_drift(world_size: int | World | None = None, model: str = "auto", steps: int = 30,
                    optimizer: str = "adam", batch_per_rank: int | None = None, backend: str = "auto",
                    device: str = "auto", timeout: float = 300.0) -> dict:
    """``ddp`` in fp32, bf16 and fp16 (with torch's default loss scale), trained on the same batches.

    ``model="auto"``: the MLP on CPU ranks, a GPU-sized transformer on GPU ranks (``dpteach.replica.sizing``),
    where 16-bit matrix products run on tensor cores and a bf16 step takes a fraction of an fp32 one;
    ``batch_per_rank=None``: 32 for a laptop model, the model's own for a GPU-sized one.

    Returns ``{"world_size", "backend", "device", "model", "model_choice", "optimizer", "steps",
    "tolerance", "fp32_vs_single", "rows": [{"precision", "losses", "final_loss", "max_abs_diff_vs_fp32",
    "relative_drift", "skipped_steps", "state_bytes", "saved_activation_bytes", "saved_weight_copy_bytes",
    "step_time_s", "step_vs_fp32", "spread": {"step_s": Spread.as_dict()}, "allocator_peak_bytes",
    "replicas_identical", "emulated", "label"}], "sixteen_bit": {"format", "bf16", "sentence"}}``. The three run
    side by side, step by step, and ``spread`` holds each one's timed steps as the rounds of a measurement, so that
    a step is called faster only beyond the noise. ``fp32_vs_single`` is the fp32 run's largest difference from one
    process (within ``tolerance``: the run is exact).

    ``sixteen_bit`` is this machine's 16-bit choice (``dpteach/ranks/gpus.py``): on a GPU without native bf16 (compute
    capability below 8.0: T4, V100) bf16 still runs, emulated, so its row is kept, marked ``emulated`` and labelled
    so in every table and figure, and the lesson times fp16 with its loss scale as the 16-bit step.
    """
    _checked(model, optimizer, steps)
    validate.optional(validate.integer, "batch_per_rank", batch_per_rank, low=1)
    setup = set_up(world_size, backend, device, model=model, load=_load(len(PRECISIONS), steps, optimizer, True))
    world, choice = setup.world, setup.choice
    base = TrainConfig(**setup.fields(batch_per_rank), strategy="ddp", steps=steps, optimizer=optimizer,
                       timing_warmup=min(2, steps - 1))
    batch_per_rank = base.batch_per_rank
    runs = _side_by_side(world, {p: replace(base, precision=p) for p in PRECISIONS}, timeout)
    on = reference_device(world.placement)
    reference = train_single_process(base, world.size, device=setup.reference_device)
    start, fp32 = _start(choice.name, base.seed, on), runs["fp32"]["params"]
    criterion, dataset = loss_fn(choice.name), make_dataset(choice.name, batch_per_rank, seed=base.seed)
    x, y = (t.to(on) for t in sample_batch(dataset, range(batch_per_rank)))  # one rank's micro-batch
    sixteen = sixteen_bit_on(world.device_type)
    rows = []
    for name, run in runs.items():
        emulated = name == "bf16" and sixteen["bf16"] == "emulated"
        with plain_fp32(on):
            saved = saved_for_backward(build_model(choice.name, seed=base.seed, device=on),
                                       lambda m: criterion(m(x), y), name)
        skipped = run["precision"]["skipped"] if run["precision"] else []
        rows.append({"precision": name, "losses": run["losses"], "final_loss": run["losses"][-1],
                     **_drift(run["params"], fp32, start), "skipped_steps": sum(skipped),
                     "state_bytes": run["state_bytes"], "saved_activation_bytes": saved["activations"],
                     "saved_weight_copy_bytes": saved["weight_copies"], "step_time_s": run["median_step_s"],
                     "step_vs_fp32": run["median_step_s"] / runs["fp32"]["median_step_s"],
                     "spread": {"step_s": run["step_spread"]},
                     "allocator_peak_bytes": run.get("allocator_peak_bytes"),
                     "replicas_identical": run["replicas_identical"], "emulated": emulated,
                     "label": f"{name} (emulated)" if emulated else name})
    if on.startswith("cuda"):  # the models measured here are gone: give their memory back to the GPU
        torch.cuda.empty_cache()
    return {**setup.facts, "optimizer": optimizer, "steps": steps, "batch_per_rank": batch_per_rank,
            "tolerance": exact_tolerance(base), "fp32_vs_single": (fp32 - reference["params"]).abs().max().item(),
            "rows": rows, "sixteen_bit": sixteen}


LOSS_SCALE_BATCH = 16  # a laptop model's batch per rank in loss_scaling (why: its docstring)


def loss_scaling(world_size: int | World | None = None, model: str = "auto", steps: int = 40,
                 init_scale: float = 2.0**24, growth_interval: int = 8, clip_norm: float = 1.0,
                 batch_per_rank: int | None = None, backend: str = "auto", device: str = "auto",
                 timeout: float = 300.0) -> dict:
    """fp16 with a dynamic loss scale on ``ddp``, clipped after unscaling (right) and before (the
    mistake), next to fp32 with the same clipping. SGD, so that a gradient's size is its update's.

    ``batch_per_rank=None``: ``LOSS_SCALE_BATCH`` for a laptop model, the model's own for a GPU-sized one. On a CPU
    without half-precision instructions (AVX2 only) an fp16 matrix product costs about 55 times a float32 one, and
    the scale's staircase and its climb are the same at 16 samples per rank as at 32 (30 steps from 2^24: nine
    halvings to 2^16, then a doubling every 8 clean steps until one overflows).

    Returns ``{"world_size", "backend", "device", "model", "steps", "batch_per_rank", "init_scale", "growth_interval",
    "clip_norm", "runs": {name: {"losses", "scales", "skipped", "grad_norms", "moved",
    "replicas_identical", "skipped_on_every_rank_alike"}}}``; ``moved`` is how far the weights
    went from where every run starts, ``grad_norms`` the norm clipping saw each step.
    """
    _checked(model, "sgd", steps)
    validate.number("init_scale", init_scale, above=0)
    validate.integer("growth_interval", growth_interval, low=1)
    validate.number("clip_norm", clip_norm, above=0)
    validate.optional(validate.integer, "batch_per_rank", batch_per_rank, low=1)
    setup = set_up(world_size, backend, device, model=model, load=_load(3, steps, "sgd", False))
    world, choice = setup.world, setup.choice
    if batch_per_rank is None and SPECS[choice.name].sized_for != "gpu":
        batch_per_rank = min(LOSS_SCALE_BATCH, choice.batch_per_rank)
    base = TrainConfig(**setup.fields(batch_per_rank), strategy="ddp", steps=steps, optimizer="sgd", precision="fp16",
                       init_scale=init_scale, growth_interval=growth_interval, clip_norm=clip_norm, timing_warmup=0)
    configs = {"fp16, unscaled then clipped": base,
               "fp16, clipped while scaled": replace(base, unscale_before_clip=False),
               "fp32, clipped": replace(base, precision="fp32")}
    runs = _side_by_side(world, configs, timeout)
    start = _start(choice.name, base.seed, reference_device(world.placement))
    return {**setup.facts, "steps": steps, "batch_per_rank": base.batch_per_rank, "init_scale": init_scale,
            "growth_interval": growth_interval, "clip_norm": clip_norm,
            "runs": {name: {"losses": run["losses"], "scales": run["precision"]["scales"],
                            "skipped": run["precision"]["skipped"], "grad_norms": run["precision"]["grad_norms"],
                            "moved": (run["params"] - start).norm().item(),
                            "replicas_identical": run["replicas_identical"]} for name, run in runs.items()}}


def comm_precision(world_size: int | World | None = None, model: str = "auto", steps: int = 30,
                   optimizer: str = "adam", backend: str = "auto", device: str = "auto",
                   timeout: float = 300.0) -> dict:
    """``ddp`` with its gradients all-reduced in fp32, bf16 and fp16 (``grad_comm``), the forward pass
    in fp32 throughout, so that the only difference is the dtype on the wire.

    Returns ``{"world_size", "backend", "device", "model", "optimizer", "steps", "rows":
    [{"grad_comm", "bytes_per_step", "bytes_vs_fp32", "max_abs_diff_vs_fp32", "relative_drift",
    "losses", "final_loss", "replicas_identical"}]}``.
    """
    _checked(model, optimizer, steps)
    setup = set_up(world_size, backend, device, model=model, at_least=2, why="gradients only travel between ranks",
                   load=_load(len(PRECISIONS), steps, optimizer, False))
    world, choice = setup.world, setup.choice
    base = TrainConfig(**setup.fields(), strategy="ddp", steps=steps, optimizer=optimizer, timing_warmup=0)
    runs = _side_by_side(world, {d: replace(base, grad_comm=d) for d in PRECISIONS}, timeout)
    start, fp32 = _start(choice.name, base.seed, reference_device(world.placement)), runs["fp32"]
    rows = [{"grad_comm": name, "bytes_per_step": run["bytes_per_step"],
             "bytes_vs_fp32": run["bytes_per_step"] / fp32["bytes_per_step"],
             **_drift(run["params"], fp32["params"], start), "losses": run["losses"],
             "final_loss": run["losses"][-1], "replicas_identical": run["replicas_identical"]}
            for name, run in runs.items()]
    return {**setup.facts, "optimizer": optimizer, "steps": steps, "rows": rows}
