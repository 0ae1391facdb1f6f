"""``compression_tradeoff``: fewer bytes on the wire, bought with a drift away from single-process training.

The strategies of ``dpteach/sync/compressed.py`` send 16-bit floats (``fp16``, ``bf16``) or 8-bit
integers with one scale per 1024 values (``int8``; ``int8_ef`` adds error feedback, Seide et al.
2014). The reference is ``bucketed``: the same buckets in float32, which equals single-process
training up to rounding. For every strategy the experiment measures:

* bytes per step, from the strategy's own counter, next to the formula (``wire_bytes_formula``);
* max |theta - theta_single| after *every* step: rank 0 first trains the single-process reference
  and keeps its weights after each step, then a global optimizer post-step hook
  (``torch.optim.optimizer.register_optimizer_step_post_hook``) compares each strategy's weights
  with the reference at the same step - the drift as it grows, not only where it ends.

Why the int8 savings shrink as W grows: int8 values cannot be summed in int8 (they overflow), so the
ranks all-gather them and each rank receives (W-1) messages, while a ring all-reduce of float32 puts
only 2(W-1)/W of the message on each rank's wire. Per element: int8 costs (W-1) x 1 byte (plus
scales), float32 costs 2(W-1)/W x 4 bytes; they cost the same at W = 8. ``compression_bytes`` runs
worlds of several sizes to show the counter following the formula.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import replace

import torch
from torch.nn.utils import parameters_to_vector
from torch.optim.optimizer import register_optimizer_step_post_hook

from .. import validate
from ..measure import spread

from ..network.costmodel import busbw_factor
from ..network.link import resolve_link
from ..ranks import context
from ..ranks.backend import plain_fp32
from ..ranks.launcher import launch
from ..ranks.rank_output import progress_bar
from ..ranks.world import World, resolve_world
from ..replica.buckets import build_buckets
from ..replica.models import SPECS, build_model
from ..replica.sizing import RunLoad
from ..replica.timeline import Timeline
from ..sync import make_strategy, strategy_class
from ..training.accounting import link_report, step_costs
from ..training.reference import exact_tolerance, reference_device, train_single_process
from ..training.train import TrainConfig, train_interleaved_on_rank, train_on_rank
from ..training.prologue import set_up

COMPRESSED = ("bucketed", "fp16", "bf16", "int8", "int8_ef")
CHUNK = 1024  # elements per int8 scale, as in dpteach/sync/compressed.py


def bucket_sizes(model: str, bucket_mb: float = 1.0) -> list[int]:
    """Elements in each gradient bucket of ``model`` (the same buckets every strategy here uses)."""
    return [b.buffer.numel() for b in build_buckets(build_model(model, device="meta"), bucket_mb)]


def wire_bytes_formula(strategy: str, world_size: int, sizes: list[int]) -> int:
    """Bytes one rank sends per step: ring all-reduce 2(W-1)/W x message; int8 all-gather (W-1) x message."""
    codec = strategy_class(strategy).codec
    if codec == "int8":
        return sum((world_size - 1) * (n + 4 * math.ceil(n / CHUNK)) for n in sizes)
    width = 4 if codec == "fp32" else 2
    return sum(int(n * width * busbw_factor(world_size)) for n in sizes)


def _snapshot(optimizer) -> torch.Tensor:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return parameters_to_vector(params).detach().to("cpu", torch.float32)


def _on_rank(configs: list[TrainConfig], reference_config: TrainConfig) -> dict:
    rank, world = context.rank(), context.world_size()
    reference, reference_losses = [], None
    if rank == 0:
        context.report_progress(0, total=len(configs) + 1, desc="reference + strategies")
        handle = register_optimizer_step_post_hook(lambda opt, args, kwargs: reference.append(_snapshot(opt)))
        try:
            reference_losses = train_single_process(reference_config, world, device=str(context.device()))["losses"]
        finally:
            handle.remove()
        context.report_progress(1)
    results = []
    for config in configs:
        drift = []
        if rank == 0:
            def compare(opt, args, kwargs):
                drift.append((_snapshot(opt) - reference[len(drift)]).abs().max().item())
            handle = register_optimizer_step_post_hook(compare)
        try:
            result = train_on_rank(config)
        finally:
            if rank == 0:
                handle.remove()
        result["drift_per_step"] = drift
        result.pop("spans")  # not needed here; keeps what travels back small
        results.append(result)
        if rank == 0:
            context.report_progress(1)
    return {"runs": results, "reference_losses": reference_losses}


def compression_tradeoff(world_size: int | World | None = None, model: str = "auto", steps: int = 10,
                         strategies=COMPRESSED, bucket_mb: float | None = None, batch_per_rank: int | None = None,
                         seed: int = 0, link=None, backend: str = "auto", device: str = "auto",
                         timeout: float = 600.0) -> dict:
    """Train each strategy; return bytes, drift per step, losses and the single-process reference's losses.

    ``model="auto"``: the MLP on CPU ranks, a GPU-sized transformer on GPU ranks (``dpteach.replica.sizing``);
    ``bucket_mb`` and ``batch_per_rank`` None: the model's cap; 32 per rank for a laptop model, the
    model's own for a GPU-sized one. The drift is measured against single-process training, so this
    experiment needs real ranks (``compression_on_links`` also runs with emulated peers).

    Returns ``{"world_size", "backend", "device", "model", "model_choice", "steps", "tolerance",
    "bucket_sizes", "rows": [{"strategy", "codec", "bytes_per_step", "bytes_formula", "bytes_vs_fp32",
    "drift_per_step", "max_abs_diff_vs_single", "losses", "step_time_s", "replicas_identical"}],
    "reference_losses", "half_range" (:func:`half_precision_range` at this W and at W = 64)}``.
    """
    strategies = validate.choices("strategies", strategies, COMPRESSED)
    validate.optional(validate.integer, "batch_per_rank", batch_per_rank, low=1)
    setup = set_up(world_size, backend, device, model=model, link=link,
                   load=lambda world: RunLoad(steps=steps * (len(strategies) + world.size), cpu_model="mlp",
                                              batch_per_rank=32))
    world, emulated, choice = setup.world, setup.link, setup.choice
    base = TrainConfig(**setup.fields(batch_per_rank), steps=steps, bucket_mb=bucket_mb, seed=seed)
    configs = [replace(base, strategy=s).check(world.size) for s in strategies]
    per_rank = setup.on_ranks(_on_rank, configs, base, timeout=timeout)
    sizes = bucket_sizes(choice.name, base.bucket_mb)
    fp32 = wire_bytes_formula("bucketed", world.size, sizes)
    rows = []
    for i, name in enumerate(strategies):
        ranks = [per_rank[r]["runs"][i] for r in range(world.size)]
        drift = ranks[0]["drift_per_step"]
        rows.append({
            "strategy": name, "codec": strategy_class(name).codec,
            "bytes_per_step": statistics.mean(r["wire_bytes_per_step"] for r in ranks),
            "bytes_formula": wire_bytes_formula(name, world.size, sizes),
            "bytes_vs_fp32": statistics.mean(r["wire_bytes_per_step"] for r in ranks) / fp32,
            "drift_per_step": drift, "max_abs_diff_vs_single": drift[-1],
            "losses": ranks[0]["losses"], "step_time_s": statistics.mean(r["median_step_s"] for r in ranks),
            "replicas_identical": all(r["replica_spread"] == 0.0 for r in ranks),
            "time_set_by": (link_report(ranks) or {}).get("time_set_by"),
        })
    return {**setup.facts, "steps": steps, "bucket_mb": base.bucket_mb, "tolerance": exact_tolerance(base),
            "link": None if emulated is None else emulated.as_dict(),
            "bucket_sizes": sizes, "rows": rows, "reference_losses": per_rank[0]["reference_losses"],
            "half_range": half_precision_range(choice.name, (world.size, 64), seed=seed,
                                               device=reference_device(world.placement))}


def _timed_on_rank(configs: list[TrainConfig]) -> list[dict]:
    """Every (strategy, link) run side by side, step by step: their step times meet the same load."""
    if context.rank() == 0:
        context.report_progress(0, total=1, desc="strategies on both links")
    outs = train_interleaved_on_rank(configs)
    if context.rank() == 0:
        context.report_progress(1)
    return [{k: out[k] for k in ("median_step_s", "step_times", "losses", "link", "wire_bytes_per_step",
                                 "median_exposed_s", "median_overhead_s")}
            for out in outs]


CPU_LINKS, GPU_LINKS = ("1gbe", "10gbe"), ("10gbe", "ib")  # a slow and a fast link, for laptop and for GPU models


def compression_on_links(world_size: int | World | None = None, model: str = "auto", links=None,
                         strategies=COMPRESSED, steps: int = 10, batch_per_rank: int | None = None, seed: int = 0,
                         backend: str = "auto", device: str = "auto", timeout: float = 600.0,
                         peers: str | None = None) -> dict:
    """Where compression pays: each strategy on a slow and a fast emulated link, in one world.

    The bytes a strategy saves are worth their time on the wire, which only a slow link makes large;
    encoding and decoding cost compute on every link. Loss per step does not depend on the link (the
    same arithmetic); time per step does. ``model="auto"``: the MLP on CPU ranks, a GPU-sized
    transformer on GPU ranks; ``peers="emulated"``: one real rank timed as ``world_size`` (``dpteach.ranks.world``).
    ``links=None``: 1 and 10 Gbit/s Ethernet on CPU ranks; 10 Gbit/s Ethernet and InfiniBand on GPU ranks,
    whose models' gradients are a hundred times larger (over 1 Gbit/s a step would take seconds).
    Returns ``{"world_size", "model", "model_choice", "peers", "links": [link dicts], "steps", "rows":
    [{"strategy", "link", "step_time_s", "local_step_s", "bytes_per_step", "losses", "time_set_by",
    "exposed_comm_s", "overhead_s", "overhead_parts", "spread": {"step_s": Spread.as_dict()}}], "local_step_s",
    "local_spread"}``; ``local`` (no communication) is the compute floor. Every run takes its steps interleaved
    with the others', and ``spread`` holds its timed steps as the rounds of a measurement.
    """
    strategies = validate.choices("strategies", strategies, COMPRESSED)
    validate.optional(validate.integer, "batch_per_rank", batch_per_rank, low=1)

    def links_of(world) -> list:
        emulated = [resolve_link(link) for link in (links if links is not None else
                                                    GPU_LINKS if world.device_type == "cuda" else CPU_LINKS)]
        if not emulated or any(link is None for link in emulated):
            raise ValueError(f"links={list(links)!r} is not allowed: give one or more emulated links (preset names "
                             f"or {{'alpha_s', 'beta_s_per_byte'}})")
        return emulated

    def load(world) -> RunLoad:
        emulated = links_of(world)
        runs = 1 + len(emulated) * len(strategies)
        return RunLoad(steps=runs * steps, models_at_once=runs, cpu_model="mlp", batch_per_rank=32, link=emulated[0])

    setup = set_up(world_size, backend, device, peers, model=model, load=load, emulated_peers_ok=True)
    world, emulated = setup.world, links_of(setup.world)
    base = TrainConfig(**setup.fields(batch_per_rank), steps=steps, seed=seed)
    configs = [replace(base, strategy="local").check(world)]
    configs += [replace(base, strategy=s, link=link).check(world) for link in emulated for s in strategies]
    per_rank = setup.on_ranks(_timed_on_rank, configs, timeout=timeout)
    local = statistics.mean(per_rank[r][0]["median_step_s"] for r in range(world.size))
    timed = range(min(base.timing_warmup, steps - 1), steps)
    rows = []
    for i, config in enumerate(configs[1:], start=1):
        ranks = [per_rank[r][i] for r in range(world.size)]
        rows.append({"strategy": config.strategy, "link": config.link.name, **step_costs(config.strategy, ranks, local),
                     "spread": {"step_s": _rounds([per_rank[r][i] for r in range(world.size)], timed)},
                     "local_step_s": local, "bytes_per_step": statistics.mean(r["wire_bytes_per_step"] for r in ranks),
                     "losses": ranks[0]["losses"], "time_set_by": (link_report(ranks) or {}).get("time_set_by")})
    return {**setup.facts, "links": [link.as_dict() for link in emulated], "steps": steps,
            "batch_per_rank": base.batch_per_rank, "local_step_s": local,
            "local_spread": _rounds([per_rank[r][0] for r in range(world.size)], timed), "rows": rows}


def _rounds(ranks: list[dict], timed: range) -> dict:
    """The timed steps of one run as the rounds of a measurement: each step's time averaged over the ranks, then
    the median and its interval (``dpteach.measure``). Every run here took its step s in turn with the others, so
    the intervals of two runs can be compared (``Spread.below``)."""
    return spread([statistics.mean(r["step_times"][s] for r in ranks) for s in timed]).as_dict()


def half_precision_range(model: str = "mlp", world_sizes=(2, 64), samples: int = 128, seed: int = 0,
                         device: str = "cpu") -> dict:
    """Where 16-bit floats lose this model's real gradients: the share that underflows to zero, or
    becomes subnormal (fewer significant bits), once divided by W as the fp16 strategies and DDP's
    ``fp16_compress_hook`` do before the all-reduce. Host only, one backward; no ranks.

    fp16's smallest normal number is 2^-14 (about 6.1e-5) and its smallest subnormal 2^-24 (about
    6e-8); bf16 has float32's exponent range. Returns ``{"model", "nonzero", "rows": [{"world_size",
    "format", "underflow", "subnormal"}]}`` (shares of the nonzero gradient values).
    """
    net = build_model(model, seed=seed, device=device)
    from ..replica.data import loss_fn, make_dataset, sample_batch
    samples = min(samples, SPECS[model].batch_per_rank or samples)  # a GPU-sized model: one rank's batch
    x, y = (t.to(device) for t in sample_batch(make_dataset(model, samples, seed=seed), range(samples)))
    with plain_fp32(device):
        loss_fn(model)(net(x), y).backward()
    grad = torch.cat([p.grad.reshape(-1) for p in net.parameters()])
    grad = grad[grad != 0]
    rows = []
    for w in world_sizes:
        for fmt, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
            half = (grad / w).to(dtype)
            tiny = torch.finfo(dtype).tiny  # the smallest normal number
            rows.append({"world_size": w, "format": fmt, "underflow": (half == 0).float().mean().item(),
                         "subnormal": ((half != 0) & (half.abs() < tiny)).float().mean().item()})
    return {"model": model, "nonzero": grad.numel(), "rows": rows}


def _bytes_on_rank(strategies, model_name: str, bucket_mb: float) -> list[int]:
    """One ``finish()`` of each strategy on random gradients: real collectives, no training.

    The byte counter depends on the bucket sizes and W only, so one exchange is enough - and skipping
    the optimizer keeps the world cheap to start (torch imports its compiler stack on the first optimizer).
    """
    counts = []
    for name in strategies:
        model = build_model(model_name, device=context.device())
        generator = torch.Generator().manual_seed(context.rank())
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=generator).to(p.device)
        strategy = make_strategy(name, model, Timeline(context.device()), bucket_mb)
        strategy.start_step(0)
        strategy.finish(0)
        counts.append(strategy.wire_bytes)
    return counts


def compression_bytes(world_sizes=(2, 3, 4), model: str = "mlp", bucket_mb: float = 1.0,
                      strategies=("bucketed", "fp16", "int8"), known: dict | None = None,
                      backend: str = "auto", device: str = "auto", timeout: float = 300.0) -> dict:
    """Bytes per step of each strategy at each world size: the strategies' counters next to the formula.

    Each world runs one gradient exchange per strategy (the counter does not depend on the data). ``known``
    may carry a ``compression_tradeoff`` result, whose world size is then not run again.
    Returns ``{"model", "bucket_mb", "rows": [{"world_size", "strategy", "measured", "formula"}]}``.
    """
    strategies = validate.choices("strategies", strategies, COMPRESSED)
    sizes = bucket_sizes(model, bucket_mb)
    rows = []
    for world in progress_bar(list(world_sizes), desc="worlds"):  # each world takes seconds to start
        measured = None
        if known is not None and known["world_size"] == world and known["model"] == model \
                and known["bucket_mb"] == bucket_mb:
            by_name = {r["strategy"]: r["bytes_per_step"] for r in known["rows"]}
            if all(s in by_name for s in strategies):
                measured = [by_name[s] for s in strategies]
        if measured is None:
            measured = launch(_bytes_on_rank, resolve_world(world, backend, device),
                              args=(strategies, model, bucket_mb), timeout=timeout, show_output=False)[0]
        for name, value in zip(strategies, measured):
            rows.append({"world_size": world, "strategy": name, "measured": value,
                         "formula": wire_bytes_formula(name, world, sizes)})
    return {"model": model, "bucket_mb": bucket_mb, "rows": rows}
