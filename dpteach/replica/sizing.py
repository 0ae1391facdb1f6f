"""Which model a run trains when the learner leaves ``model="auto"``: one sized for where its ranks compute.

A lesson's point shows only in the regime it is about. On a laptop's cores the course's small models
already balance compute and communication (``models.py``). On a GPU they finish a step in a few
milliseconds of kernel launches, so a GPU run of the same lesson would time launch overhead, not
backward or the exchange. So ``model="auto"`` decides by the ranks' device:

* **CPU ranks**: the lesson's own laptop model (the MLP or the tiny transformer), always.
* **GPU ranks**: the largest model of the GPU-sized transformer family that

  1. *fits*: its bytes per rank - weights, gradients, the strategy's second copy of the gradients,
     optimizer state, for every model the run holds at once, plus one batch's activations - stay
     under ``MEMORY_SHARE`` of the free memory of the GPU, divided between the ranks that share it;
  2. *finishes in time*: its predicted step, times the steps one panel run trains, stays within the
     lesson's budget (``PANEL_BUDGET_S``). A step is predicted from the model's arithmetic - 6 FLOPs
     per weight of a matrix product per token for forward and backward (Kaplan et al., "Scaling Laws
     for Neural Language Models", 2020, section 2.1), plus attention's 12 x seq x d_model per token and
     layer - at ``EFFICIENCY`` of this GPU's fp32 matrix-multiply rate, *measured* here once per
     process (:func:`measure_gpu`; TF32 off, as in every rank).

If none fits, the tiny transformer runs, and the reason says why. An explicit model name is used as
given. Either way the run reports a :class:`ModelChoice`: the model, its parameter count and the
sentence that says why it was chosen, which every panel prints under its results.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from functools import lru_cache

import torch

from .. import validate

from ..network import costmodel
from ..ranks.backend import plain_fp32
from .models import SPECS, check_model_name, default_batch_per_rank, model_names, parameter_count

AUTO = "auto"
# One panel run, start-up included; DPTEACH_PANEL_BUDGET_S changes it (a course on a slow GPU, or a check
# that must run every lesson within minutes, may want less).
PANEL_BUDGET_S = float(os.environ.get("DPTEACH_PANEL_BUDGET_S", "30"))
STARTUP_S = 6.0  # starting the ranks, CUDA and NCCL, building the models: a few seconds per world on one H200
EFFICIENCY = 0.6  # the share of the measured matmul rate a training step sustains (cautious: attention,
#                   layer norms, GELU and the optimizer run at memory speed, not at the matmul rate)
MEMORY_SHARE = 0.7  # of the free GPU memory: room for the allocator's fragmentation and CUDA's own buffers
ACTIVATION_FLOATS = 24  # saved for backward per token and layer, in units of d_model (LayerNorms, q k v,
#                         attention output, residuals, the 4 x d_model feed-forward in and out), fp32
OPTIMIZER_FLOATS = {"sgd": 1, "adam": 2}  # state per weight: SGD's momentum; Adam's two moments


@dataclass(frozen=True)
class RunLoad:
    """What one panel run asks of each rank, so a model can be sized for it.

    ``steps``: optimizer steps each rank trains in all (every strategy of the run, and the single-process
    reference where one is trained, counted in steps of one rank's batch); ``models_at_once``: models a
    rank holds at the same time (runs trained side by side, interleaved); ``cpu_model``: the lesson's model
    on CPU ranks; ``batch_per_rank``: the lesson's batch for a laptop model; ``launches``: worlds started
    one after another, each paying the start-up; ``link``: an emulated link, whose time for an all-reduce of
    the gradients is added to every step (as if none of it were hidden: a cautious estimate).
    """

    steps: int
    models_at_once: int = 1
    optimizer: str = "sgd"
    cpu_model: str = "mlp"
    batch_per_rank: int | None = None
    launches: int = 1  # worlds started one after another (a scaling sweep: one per W)
    link: object = None  # an emulated link (dpteach.network.Link)


@dataclass(frozen=True)
class GpuCapacity:
    """One GPU as :func:`measure_gpu` found it: its name, free and total memory, and fp32 matmul rate."""

    name: str
    free_bytes: int
    total_bytes: int
    fp32_tflops: float


@dataclass(frozen=True)
class ModelChoice:
    """The model a run trains, its size, its per-rank batch, and why it was chosen."""

    name: str
    params: int
    batch_per_rank: int
    reason: str
    asked: str = AUTO
    predicted_step_s: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """The line a panel prints: 'model transformer-110m (111.0 M parameters): chosen because ...'."""
        return f"model {self.name} ({self.params / 1e6:.1f} M parameters, batch {self.batch_per_rank} per rank): {self.reason}"


@lru_cache(maxsize=None)
def measure_gpu(index: int = 0) -> GpuCapacity:
    """Free memory and the fp32 matrix-multiply rate of GPU ``index``, measured once per process.

    The rate is timed with CUDA events over five 4096 x 4096 products after a warm-up, with TF32 off
    (every rank turns it off: ``backend.use_device``). About 0.1 s on a recent GPU.
    """
    device = torch.device("cuda", index)
    free, total = torch.cuda.mem_get_info(device)
    n, reps = 4096, 5
    with plain_fp32(str(device)):
        a = torch.randn(n, n, device=device)
        b = torch.randn(n, n, device=device)
        a @ b  # warm-up: cuBLAS picks its kernel
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            a @ b
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3
    del a, b
    torch.cuda.empty_cache()
    return GpuCapacity(torch.cuda.get_device_name(device), int(free), int(total), 2 * n ** 3 * reps / seconds / 1e12)


def step_flops(name: str, batch_per_rank: int) -> float:
    """FLOPs of one forward and backward of a transformer of the family on ``batch_per_rank`` sequences."""
    spec = SPECS[name]
    tokens = batch_per_rank * spec.seq_len
    matmul_weights = parameter_count(name) - (spec.vocab + spec.seq_len) * spec.d_model  # embeddings are lookups
    return 6 * matmul_weights * tokens + 12 * spec.layers * spec.seq_len * spec.d_model * tokens


def bytes_per_rank(name: str, batch_per_rank: int, load: RunLoad) -> int:
    """Estimated memory one rank needs: every model it holds at once, and one batch's activations (fp32)."""
    spec = SPECS[name]
    floats_per_weight = 3 + OPTIMIZER_FLOATS.get(load.optimizer, 2)  # weights, gradients, a bucket copy, state
    states = load.models_at_once * parameter_count(name) * floats_per_weight * 4
    per_sample = spec.seq_len * (spec.layers * ACTIVATION_FLOATS * spec.d_model + 3 * spec.vocab) * 4  # + logits
    return states + batch_per_rank * per_sample


def predicted_step_s(name: str, batch_per_rank: int, gpu: GpuCapacity, ranks_per_gpu: int = 1) -> float:
    """One step's predicted time on ``gpu`` (ranks sharing a GPU take turns on it)."""
    return ranks_per_gpu * step_flops(name, batch_per_rank) / (gpu.fp32_tflops * 1e12 * EFFICIENCY)


def check_model(model: str) -> str:
    """``model`` when it is "auto" or a model's name; else a ValueError that lists the choices."""
    return AUTO if model == AUTO else validate.choice("model", model, (AUTO, *model_names()))


def choose_model(model: str, world, load: RunLoad, budget_s: float = PANEL_BUDGET_S) -> ModelChoice:
    """The model a run of ``load`` trains in ``world`` (a resolved ``dpteach.ranks.world.World``); see the module note."""
    check_model(model)
    check_model_name(load.cpu_model)
    lesson_batch = load.batch_per_rank or default_batch_per_rank(load.cpu_model)
    if model != AUTO:
        batch = SPECS[model].batch_per_rank or lesson_batch
        return ModelChoice(model, parameter_count(model), batch, "the model asked for", asked=model)
    if world.device_type != "cuda":
        return ModelChoice(load.cpu_model, parameter_count(load.cpu_model), lesson_batch,
                           "the ranks compute on CPU cores, so the lesson's laptop-sized model")
    placement = world.placement
    ranks_per_gpu = max(1, math.ceil(world.size / max(1, placement.gpus)))
    gpu = measure_gpu(0)
    room = MEMORY_SHARE * gpu.free_bytes / ranks_per_gpu
    too_big = []
    for name in sorted(model_names("gpu"), key=parameter_count, reverse=True):
        batch = SPECS[name].batch_per_rank
        need = bytes_per_rank(name, batch, load)
        step = predicted_step_s(name, batch, gpu, ranks_per_gpu)
        if load.link is not None:
            step += costmodel.collective_time("all_reduce", 4 * parameter_count(name), world.timed_size, load.link)
        total = STARTUP_S * load.launches + load.steps * step
        if need > room:
            too_big.append(f"{name} needs about {need / 2**30:.0f} GiB per rank of {room / 2**30:.0f} GiB")
        elif total > budget_s:
            too_big.append(f"{name} would take about {total:.0f} s")
        else:
            others = f" ({'; '.join(too_big)})" if too_big else ""
            return ModelChoice(name, parameter_count(name), batch,
                               f"the largest GPU-sized model that fits {gpu.name} ({gpu.free_bytes / 2**30:.0f} GiB "
                               f"free, {gpu.fp32_tflops:.0f} fp32 TFLOP/s measured) and a {budget_s:.0f} s panel run: "
                               f"about {total:.0f} s predicted for {load.steps} steps{others}",
                               predicted_step_s=step)
    fallback = "transformer"
    return ModelChoice(fallback, parameter_count(fallback), default_batch_per_rank(fallback),
                       f"no GPU-sized model fits {gpu.name} and a {budget_s:.0f} s panel run ({'; '.join(too_big)}), "
                       f"so the tiny transformer: its timings measure kernel launches more than compute")


def describe_choice(choice: dict) -> str:
    """The line every panel and the command line print about the model a run trained (from ``as_dict()``)."""
    return ModelChoice(**choice).describe()


def run_facts(world, choice: ModelChoice) -> dict:
    """What every result of a training experiment says about where and what it ran: the world (with
    emulated peers, the world being emulated, and the note every figure repeats) and the model chosen."""
    return {"world_size": world.timed_size, "real_ranks": world.size, "peers": world.peers,
            "peers_note": world.peers_note(), "backend": world.backend, "device": world.device_type,
            "model": choice.name, "model_choice": choice.as_dict()}
