"""Lesson 03: one all-reduce per parameter, or one per bucket?

Every all-reduce pays a fixed latency before its first byte moves: with the ring that is
``2(W-1) alpha`` (``dpteach.network.costmodel``). ``naive`` sends each parameter tensor on its own and
pays it once per tensor; ``bucketed`` packs the gradients into flat buffers of about
``bucket_mb`` (the course's simple rule of ``dpteach/replica/buckets.py``: reverse parameter order,
smaller first bucket, after Li et al., VLDB 2020; ``ddp_buckets.py`` shows what DDP itself does)
and pays it once per bucket. The bytes on the wire are the same; only the number of
messages changes - and so does the result, not at all.

``bucket_size_sweep`` trains the same model in one world with ``local`` (no communication: the
compute floor), ``naive`` and ``bucketed`` at several bucket sizes. In the same world it first
measures the built-in all-reduce's alpha and beta (``bench.link_on_rank``), so the predicted
latency cost, messages x ``2(W-1) alpha``, uses this machine's latency measured a moment before.
The configurations are trained side by side, step s of each in turn
(``train.train_interleaved_on_rank``): on a shared machine the background load drifts, and
interleaving makes every configuration meet the same conditions, so their ratios stay meaningful.
The timed steps are then the rounds of a measurement (``dpteach/measure.py``): each row carries the
median step and exposed communication with their intervals, and a lesson names a winner only where
the intervals separate.
"""
from __future__ import annotations

import statistics
from dataclasses import replace

from .. import validate

from ..measure import spread
from ..ranks import context
from ..replica.timeline import exposed_time
from ..sync import strategy_class

from ..network import costmodel
from ..network.link import resolve_link
from ..ranks.world import World
from ..replica.buckets import assign_buckets
from ..replica.models import build_model, check_model_name
from ..replica.sizing import RunLoad
from ..training.accounting import link_report, step_costs
from ..training.train import TrainConfig, train_interleaved_on_rank
from .bench import link_on_rank
from ..training.prologue import set_up

DEFAULT_SIZES_MB = (0.01, 0.25, 1.0, 4.0, 32.0)


def bucket_assignment(model: str = "mlp", bucket_mb: float = 1.0, first_bucket_mb: float | None = None) -> dict:
    """The buckets DDP's rule builds for ``model``, in launch order (host only, no ranks).

    Returns ``{"model", "bucket_mb", "first_bucket_mb" (the cap actually used), "num_tensors",
    "grad_bytes", "parameters": [names in model order], "buckets": [{"index", "params": [names, last
    layer first], "numel", "bytes"}, ...]}``.
    """
    check_model_name(model)
    named = [(n, p) for n, p in build_model(model, device="meta").named_parameters() if p.requires_grad]
    groups = assign_buckets([p for _, p in named], bucket_mb, first_bucket_mb)
    buckets = [{"index": i, "params": [named[j][0] for j in idx],
                "numel": sum(named[j][1].numel() for j in idx),
                "bytes": sum(named[j][1].numel() * named[j][1].element_size() for j in idx)}
               for i, idx in enumerate(groups)]
    return {"model": model, "bucket_mb": bucket_mb,
            "first_bucket_mb": bucket_mb / 4 if first_bucket_mb is None else first_bucket_mb,
            "num_tensors": len(named), "grad_bytes": sum(b["bytes"] for b in buckets),
            "parameters": [n for n, _ in named], "buckets": buckets}


def _messages_in_step(spans: list[dict], step: int) -> int:
    return sum(1 for s in spans if s["lane"] == "comm" and s["step"] == step)


def _comm_per_step(spans: list[dict], first_step: int) -> float:
    """Median over the timed steps of the time this rank spent inside blocking all-reduces."""
    per_step: dict = {}
    for s in spans:
        if s["lane"] == "comm" and s["step"] >= first_step:
            per_step[s["step"]] = per_step.get(s["step"], 0.0) + s["end"] - s["start"]
    return statistics.median(per_step.values()) if per_step else 0.0


def _sweep_on_rank(configs: list[TrainConfig]) -> dict:
    rank = context.rank()
    if rank == 0:
        context.report_progress(0, total=2, desc="bucket sizes")
    link = link_on_rank() if context.world_size() > 1 else None  # one real rank (emulated peers): nothing to measure
    if rank == 0:
        context.report_progress(1)
    outs = train_interleaved_on_rank(configs)
    if rank == 0:
        context.report_progress(1)
    reference = next(o["params"] for c, o in zip(configs, outs) if c.strategy == "naive") if rank == 0 else None
    runs = []
    for config, out in zip(configs, outs):
        first = config.timing_warmup if config.steps > config.timing_warmup else 0
        exact = rank == 0 and config.strategy != "local"
        runs.append({"median_step_s": out["median_step_s"], "wire_bytes_per_step": out["wire_bytes_per_step"],
                     "median_exposed_s": out["median_exposed_s"], "median_overhead_s": out["median_overhead_s"],
                     "link": out["link"], "step_times": out["step_times"],
                     "comm_s": _comm_per_step(out["spans"], first), "messages": _messages_in_step(out["spans"], first),
                     "first_timed": first,
                     "exposed_per_step": [exposed_time([x for x in out["spans"] if x["step"] == step])
                                          for step in range(len(out["step_times"]))],
                     "replica_spread": out["replica_spread"],
                     "max_abs_diff_vs_naive": (out["params"] - reference).abs().max().item() if exact else None})
    return {"link": link, "runs": runs}


SWEPT = ("bucketed", "overlap")


def bucket_size_sweep(world_size: int | World | None = 2, model: str = "auto", bucket_sizes_mb=DEFAULT_SIZES_MB,
                      steps: int = 10, batch_per_rank: int | None = None, strategies=("bucketed",), link=None,
                      backend: str = "auto", device: str = "auto", peers: str | None = None) -> dict:
    """Step time of per-parameter vs bucketed all-reduce, over bucket sizes, in one launch.

    ``strategies``: which bucketed strategies to sweep, ``bucketed`` (after backward) and/or ``overlap``
    (launched during backward: its step time shows both sides of the trade-off - many small buckets
    pay a latency each, one huge bucket cannot leave before backward ends). ``link``: an emulated
    network (``dpteach.network.emulated``); the predictions then use its alpha and beta instead of this machine's.
    ``model="auto"``: the transformer on CPU ranks, a GPU-sized one on GPU ranks (``dpteach.replica.sizing``);
    ``batch_per_rank=None``: 64 for a laptop model, the model's own for a GPU-sized one.
    ``peers="emulated"``: one real rank, its exchange timed on ``link`` as among ``world_size`` ranks
    (``dpteach.ranks.world``); the results' exactness is then not shown (``max_abs_diff_vs_naive`` is None).

    Returns plain data::

        {"world_size", "model", "model_choice", "peers", "link" (the emulated link, or None), "num_tensors", "grad_bytes",
         "alpha_s", "beta_s_per_byte" (the emulated link's, else this machine's, measured),
         "latency_per_allreduce_s" (= 2(W-1) alpha), "local_step_s",
         "rows": [{"strategy", "bucket_mb" (None for naive/local), "label", "num_buckets",
                   "messages_per_step" (counted from the run's spans), "bytes_per_step", "step_time_s",
                   "comm_s" (time inside the all-reduces, from the run's spans),
                   "exposed_comm_s" (waited for, measured), "overhead_s" (step - local - exposed),
                   "overhead_parts", "predicted_latency_s" (messages x latency),
                   "predicted_comm_s" (+ bandwidth term), "max_abs_diff_vs_naive",
                   "time_set_by" ("link" or "machine", with an emulated link),
                   "step_spread", "exposed_spread" (the timed steps' median and interval, ``Spread.as_dict()``;
                   no exposed_spread for ``local``)}, ...]}
    """
    sizes = sorted({float(s) for s in bucket_sizes_mb})
    if not sizes or any(not s > 0 for s in sizes):
        raise ValueError(f"bucket_sizes_mb={list(bucket_sizes_mb)!r} is not allowed: give bucket sizes in MB > 0")
    validate.integer("steps", steps, low=3)
    validate.optional(validate.integer, "batch_per_rank", batch_per_rank, low=1)
    strategies = tuple(validate.choices("strategies", strategies, SWEPT))
    runs = 2 + len(strategies) * len(sizes)
    setup = set_up(world_size, backend, device, peers, model=model, link=link, at_least=2,
                   why="an all-reduce needs two ranks or more", emulated_peers_ok=True,
                   load=RunLoad(steps=runs * steps, models_at_once=runs, cpu_model="transformer", batch_per_rank=64))
    world, emulated, choice = setup.world, setup.link, setup.choice
    base = TrainConfig(**setup.fields(batch_per_rank), steps=steps, timing_warmup=2)
    configs = [replace(base, strategy="local"), replace(base, strategy="naive")]
    configs += [replace(base, strategy=name, bucket_mb=s) for name in strategies for s in sizes]
    for config in configs:
        config.check(world)
    ranks = setup.on_ranks(_sweep_on_rank, configs, timeout=600)
    link = emulated.as_dict() if emulated is not None else ranks[0]["link"]
    on_link = resolve_link(link, "link")
    per_message = costmodel.predict("ring", 0, world.timed_size, on_link)
    tensors = [p for p in build_model(choice.name, device="meta").parameters() if p.requires_grad]
    grad_bytes = sum(p.numel() * p.element_size() for p in tensors)
    bandwidth_s = costmodel.predict("ring", grad_bytes, world.timed_size, on_link) - per_message

    def mean(i, key):  # averaged over ranks (they wait for each other, so they agree closely)
        return statistics.mean(r["runs"][i][key] for r in ranks)

    def step_time(i):
        return mean(i, "median_step_s")

    local = step_time(0)
    rows = []
    for i, config in enumerate(configs):
        first = ranks[0]["runs"][i]
        messages = first["messages"]
        bucketed = config.strategy in SWEPT
        label = f"{config.bucket_mb:g} MiB" if bucketed else config.strategy
        timed = range(first["first_timed"], len(first["step_times"]))
        spreads = {"step_spread": spread([statistics.mean(r["runs"][i]["step_times"][s] for r in ranks) for s in timed])}
        if strategy_class(config.strategy).measures_exposure:
            spreads["exposed_spread"] = spread([statistics.mean(r["runs"][i]["exposed_per_step"][s] for r in ranks)
                                                for s in timed])
        rows.append({
            **{name: value.as_dict() for name, value in spreads.items()},
            "strategy": config.strategy, "bucket_mb": config.bucket_mb if bucketed else None,
            "label": f"{config.strategy} {label}" if bucketed and len(strategies) > 1 else label,
            "num_buckets": len(assign_buckets(tensors, config.bucket_mb)) if bucketed else None,
            "messages_per_step": messages, "bytes_per_step": first["wire_bytes_per_step"],
            **step_costs(config.strategy, [r["runs"][i] for r in ranks], local), "comm_s": mean(i, "comm_s"),
            "predicted_latency_s": messages * per_message,
            "predicted_comm_s": messages * per_message + (bandwidth_s if messages else 0.0),
            "max_abs_diff_vs_naive": None if world.emulated_size else first.get("max_abs_diff_vs_naive"),
            "replicas_identical": all(r["runs"][i]["replica_spread"] == 0.0 for r in ranks),
            "time_set_by": (link_report([r["runs"][i] for r in ranks]) or {}).get("time_set_by"),
        })
    return {**setup.facts, "link": None if emulated is None else emulated.as_dict(),
            "strategies": strategies, "num_tensors": len(tensors), "grad_bytes": grad_bytes, "alpha_s": link["alpha_s"],
            "beta_s_per_byte": link["beta_s_per_byte"], "latency_per_allreduce_s": per_message,
            "local_step_s": local, "rows": rows, "steps": steps, "batch_per_rank": base.batch_per_rank}
