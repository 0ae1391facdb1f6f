"""Sharded data parallelism (lesson 11): what ZeRO's stages and FSDP2 save, measured on real ranks.

* ``sharding_memory`` trains ``ddp``, ``zero1``, ``zero2``, ``zero3`` and ``fsdp`` side by side and
  reports, per strategy, what a rank holds when its optimizer steps (measured from its tensors), its
  peak with the transient unsharded buffers, and the bytes it sends per step - next to what the ZeRO
  paper's accounting predicts for this model (Rajbhandari et al., SC 2020, section 5). Beside them, the
  activations one forward pass of a rank's micro-batch keeps for backward: they come on top of the
  states, grow with the per-rank batch and are the same under every strategy (lesson 15 measures them).
* ``sharding_timeline`` records every rank's spans for ``zero3`` or ``fsdp``: the all-gathers of the
  next layer issued before the current layer computes (prefetching), and where FSDP2 on CPU does not.
* ``sharding_payoff`` is arithmetic, instant: for a model size, a GPU and a link, the memory per GPU
  of each stage as W grows (the lesson-01 calculator) and what its communication costs per step
  (the alpha-beta model of ``dpteach.network.costmodel``).
"""
from __future__ import annotations

import torch

from .. import validate

from ..network import costmodel
from ..network.link import resolve_link
from ..ranks.backend import plain_fp32
from ..ranks.world import World, resolve_world
from ..replica.activations import saved_activation_bytes
from ..replica.build import OPTIMIZERS
from ..replica.data import loss_fn, make_dataset, sample_batch
from ..replica.model_states import model_state_bytes
from ..replica.models import build_model
from ..replica.sizing import RunLoad, check_model
from ..replica.timeline import exposed_time, start_together
from ..replica.trace import save_trace
from ..sync import strategy_class
from ..sync.fsdp_trace import fsdp_spans, profile_step
from ..training.reference import reference_device
from ..training.train import SyncTrainer, TrainConfig
from .compare import compare_strategies, run_strategy
from ..training.prologue import set_up

COMPARED = ("ddp", "zero1", "zero2", "zero3", "fsdp")  # the replicated reference, then each stage
TIMELINE_STRATEGIES = ("zero3", "fsdp")  # the two that gather parameters, and so can prefetch
OPTIMIZER_FLOATS = {"sgd": 1, "adam": 2, "muon": 1}  # state per parameter: a momentum; Adam's two moments


def predicted_state_bytes(strategy: str, param_bytes: int, optimizer: str, world_size: int) -> float:
    """What a rank holds at its optimizer step under the ZeRO paper's accounting, in fp32 as here: the
    strategy's own formula (``Strategy.held_bytes_per_rank``: what it shards, divided by W)."""
    return strategy_class(strategy).held_bytes_per_rank(param_bytes, OPTIMIZER_FLOATS[optimizer], world_size)


def sharding_memory(world_size: int | World | None = None, model: str = "auto", optimizer: str = "adam",
                    steps: int = 4, accum_steps: int = 1, backend: str = "auto", device: str = "auto",
                    timeout: float = 600.0) -> dict:
    """Train DDP, ZeRO stages 1-3 and FSDP2 in one world; memory and traffic per rank, measured.

    ``model="auto"``: the MLP on CPU ranks, a GPU-sized transformer on GPU ranks (``dpteach.replica.sizing``).
    Memory per rank is what real shards hold, so this experiment needs real ranks. On GPU ranks each
    row also has the allocator's peak (``allocator_peak_bytes``, ``torch.cuda.max_memory_allocated``):
    everything the rank allocated at once, activations and FSDP2's own buffers included.

    ``activation_bytes``: what one forward pass of a rank's micro-batch (``batch_per_rank`` samples) keeps
    for backward, counted from the saved tensors (``dpteach/replica/activations.py``), measured once here,
    in this process, on the ranks' kind of device. Every strategy shards model states, none shards these:
    each rank holds those of its own micro-batch, so every row has the same number.

    Returns ``{"world_size", "backend", "device", "model", "model_choice", "optimizer", "param_bytes",
    "batch_per_rank", "activation_bytes", "tolerance", "rows": [{"strategy", "state_bytes",
    "predicted_state_bytes", "peak_bytes", "allocator_peak_bytes", "activation_bytes", "state_vs_ddp",
    "bytes_per_step", "bytes_vs_ddp", "max_abs_diff_vs_single", "replicas_identical"}]}``.
    """
    check_model(model)
    validate.choice("optimizer", optimizer, OPTIMIZERS)
    world = resolve_world(world_size, backend, device)
    validate.ranks(world, 2, "sharding needs ranks to share the work")
    report = compare_strategies(world, model=model, steps=steps, accum_steps=accum_steps, strategies=COMPARED,
                                optimizer=optimizer, timeout=timeout)
    model = report["model"]
    param_bytes = sum(p.numel() * p.element_size() for p in build_model(model, device="meta").parameters())
    activations = micro_batch_activation_bytes(model, report["batch_per_rank"], reference_device(world.placement))
    by_name = {r["strategy"]: r for r in report["rows"]}
    ddp = by_name["ddp"]
    rows = [{"strategy": name, "state_bytes": r["state_bytes_per_rank"], "peak_bytes": r["peak_bytes_per_rank"],
             "predicted_state_bytes": predicted_state_bytes(name, param_bytes, optimizer, world.size),
             "state_vs_ddp": r["state_bytes_per_rank"] / ddp["state_bytes_per_rank"],
             "bytes_per_step": r["bytes_per_step"], "bytes_vs_ddp": r["bytes_per_step"] / ddp["bytes_per_step"],
             "step_time_s": r["step_time_s"], "max_abs_diff_vs_single": r["max_abs_diff_vs_single"],
             "allocator_peak_bytes": r["allocator_peak_bytes_per_rank"], "activation_bytes": activations,
             "replicas_identical": r["replicas_identical"]} for name, r in by_name.items()]
    return {**{k: report[k] for k in ("world_size", "real_ranks", "peers", "peers_note", "backend", "device", "model",
                                      "model_choice")},
            "optimizer": optimizer, "steps": steps, "accum_steps": accum_steps, "param_bytes": param_bytes,
            "batch_per_rank": report["batch_per_rank"], "activation_bytes": activations,
            "tolerance": report["tolerance"], "rows": rows}


def micro_batch_activation_bytes(model: str, batch_per_rank: int, device: str) -> int:
    """Bytes one forward pass of ``model`` on a micro-batch of ``batch_per_rank`` keeps for backward, on
    ``device`` (weights from seed 0 and the first samples of its data: the bytes depend on neither)."""
    inputs, targets = (t.to(device) for t in sample_batch(make_dataset(model, batch_per_rank), range(batch_per_rank)))
    with plain_fp32(device):
        saved = saved_activation_bytes(build_model(model, device=device), inputs, targets, loss_fn(model))
    if str(device).startswith("cuda"):  # the model measured here is gone: give its memory back to the GPU
        torch.cuda.empty_cache()
    return saved["saved_bytes"]


def sharding_timeline(world_size: int | World | None = None, model: str = "auto", steps: int = 3,
                      strategy: str = "zero3", backend: str = "auto", device: str = "auto",
                      timeout: float = 300.0, link=None, peers: str | None = None, trace=None) -> dict:
    """Every rank's spans of the last step of ``zero3`` or ``fsdp``: forward, backward, and each
    all-gather and reduce-scatter. ``zero3`` draws its own collectives; for ``fsdp`` they are read from
    the ranges FSDP2 records for the profiler (``dpteach/sync/fsdp_trace.py``), the last step profiled.
    ``model="auto"``: the MLP on CPU ranks, a GPU-sized transformer on GPU ranks (``dpteach.replica.sizing``).
    ``link``: an emulated network for zero3's collectives (FSDP2 calls torch's own: no link reaches them);
    ``peers="emulated"`` (zero3 only): one real rank whose all-gathers and reduce-scatters the link times
    as among ``world_size`` ranks (``dpteach.ranks.world``) - the timeline of the emulated world, not its memory.

    Returns ``{"world_size", "backend", "device", "model", "model_choice", "peers", "strategy", "step",
    "spans": {rank: [span, ...]}, "gathers": {rank: {"prefetched", "on_demand"}}, "exposed_comm_s"}`` -
    the last step's all-gathers, by whether they had been launched before the layer needed them, and
    the time it waited for communication. ``trace``: a file to write every rank's whole timeline to, for
    Perfetto (``dpteach/replica/trace.py``); its path is the result's ``"trace"``.
    """
    validate.integer("steps", steps, low=2, why=" (prefetching starts once the first step has shown the order)")
    validate.choice("strategy", strategy, TIMELINE_STRATEGIES)
    setup = set_up(world_size, backend, device, peers, model=model, link=link, at_least=2,
                   why="sharding needs ranks to share the work", emulated_peers_ok=True,
                   load=lambda world: RunLoad(steps=steps * (1 + (0 if world.emulated_size else world.size)),
                                              cpu_model="mlp"))
    world, emulated = setup.world, setup.link
    config = TrainConfig(**setup.fields(), strategy=strategy, steps=steps, timing_warmup=0)
    if strategy == "fsdp":  # run_strategy checks the config itself
        ranks = setup.on_ranks(trace_fsdp_on_rank, config.check(world), timeout=timeout)
    else:
        ranks = run_strategy(world, config, timeout=timeout)["ranks"]
    last = steps - 1
    spans = {r: [s for s in run["spans"] if s["step"] == last] for r, run in enumerate(ranks)}
    exposed = [exposed_time(mine) for mine in spans.values()]
    return {**setup.facts, "strategy": strategy, "step": last, "spans": spans,
            "link": None if emulated is None else emulated.as_dict(),
            "exposed_comm_s": None if strategy == "fsdp" else sum(exposed) / len(exposed),
            "gathers": {r: run["notes"] for r, run in enumerate(ranks)},
            "trace": save_trace(trace, {strategy: ranks}, world.device_type, setup.facts)}


def trace_fsdp_on_rank(config: TrainConfig) -> dict:
    """Train ``fsdp`` on this rank and profile its last step: the trainer's spans plus FSDP2's collectives."""
    trainer = SyncTrainer(config)
    start_together(trainer.timeline)
    for step in range(config.steps - 1):
        trainer.step(step)
    last = config.steps - 1
    events, offset = profile_step(lambda: trainer.step(last), trainer.timeline)
    collectives, gathers = fsdp_spans(events, last, offset)
    summary = trainer.summary()
    return {"spans": summary["spans"] + collectives, "notes": gathers}


def sharding_payoff(params_billion: float = 7.5, world_sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
                    gpu_gb: float = 80.0, link="ib", optimizer: str = "adam", precision: str = "mixed") -> dict:
    """Which ZeRO stage fits, and what its communication costs per step, as W grows. Pure arithmetic.

    Memory per GPU comes from the ZeRO paper's arithmetic (``dpteach.replica.model_states``, lesson 01's table); the time per step of
    each stage's collectives from the alpha-beta model on ``link`` (a preset of ``dpteach.network`` or
    ``{"alpha_s", "beta_s_per_byte"}``): stages 0-2 move a reduce-scatter and an all-gather of the
    gradients' size, stage 3 one all-gather more (ZeRO section 7). Activations are left out: they do
    not depend on the stage.

    Returns ``{"params_billion", "gpu_gb", "link", "rows": [{"world_size", "stage", "gb_per_gpu",
    "fits", "comm_s"}]}``.
    """
    emulated = resolve_link(link)
    if emulated is None:
        raise validate.refusal("link", link, "give a link (a preset name or {'alpha_s', 'beta_s_per_byte'})")
    sizes = [validate.integer("world_sizes", w, low=1) for w in world_sizes]
    rows = []
    for w in sizes:
        calc = model_state_bytes(params_billion, optimizer, precision, world_size=w, gpu_gb=gpu_gb)
        grad_bytes = calc["params"] * calc["bytes_per_param"]["grads"]
        half = costmodel.collective_time("reduce_scatter", round(grad_bytes), w, emulated)  # one reduce-scatter or all-gather
        for stage in calc["by_stage"]:
            rows.append({"world_size": w, "stage": stage["stage"], "gb_per_gpu": stage["total"] / 1e9,
                         "fits": stage["fits"], "comm_s": half * (3 if stage["stage"] == 3 else 2)})
    return {"params_billion": params_billion, "gpu_gb": gpu_gb, "optimizer": optimizer, "precision": precision,
            "link": emulated.as_dict(), "rows": rows}
