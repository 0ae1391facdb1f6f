"""Every strategy on the same model and data, measured in one run and held to one reference.

``compare_strategies`` starts one world, trains each strategy in turn inside it (same seed, same
batches), and compares the final weights with single-process training on the global batch. A
strategy's *exposed communication* is its step time minus the step time of ``local`` - the same
per-rank work with no communication at all, measured in the same run - so it is measured the
same way for our strategies and for torch's DDP.

With ``link`` (a preset name of ``dpteach.link.PRESETS``, a ``Link`` or ``{"alpha_s",
"beta_s_per_byte"}``) every synchronous strategy's collectives run on that emulated network; each
row then says how many of its messages this machine was too slow to emulate (``link_report``).
The parameter server's point-to-point messages are not emulated: its row says so.
"""
from __future__ import annotations

import statistics
from dataclasses import replace

from .. import context
from ..backend import resolve_world
from ..launcher import launch
from ..link import resolve_link
from ..sync import EXACT
from ..reference import reference_device, train_single_process
from ..train import TrainConfig, train_interleaved_on_rank, train_on_rank

DEFAULT_STRATEGIES = ("local", "naive", "bucketed", "overlap", "ddp", "int8", "int8_ef", "fp16", "async")


def _train_each(configs: list[TrainConfig], interleave: bool = False) -> list[dict]:
    """Train each config in this world, one after another (or, with ``interleave``, the synchronous
    ones step by step side by side); results in the order of ``configs``."""
    results = {}
    together = [i for i, c in enumerate(configs) if interleave and c.strategy != "async"]
    if context.rank() == 0:
        context.report_progress(0, total=len(configs), desc="strategies")
    if together:
        for i, result in zip(together, train_interleaved_on_rank([configs[i] for i in together])):
            results[i] = result
        if context.rank() == 0:
            context.report_progress(len(together))
    for i, config in enumerate(configs):
        if i not in results:
            results[i] = train_on_rank(config)
            if context.rank() == 0:
                context.report_progress(1)
    return [results[i] for i in range(len(configs))]


def link_report(ranks: list[dict]) -> dict | None:
    """The emulated link's account over all ranks: the worst rank's share of machine-bound messages."""
    reports = [r.get("link") for r in ranks if r.get("link") and r["link"]["messages"]]
    if not reports:
        return None
    worst = max(reports, key=lambda rep: rep["machine_bound_share"])
    steps = len(ranks[0]["step_times"]) or 1
    return {"messages_per_step": worst["messages"] / steps, "link_seconds_per_step": worst["link_seconds"] / steps,
            "machine_bound_share": worst["machine_bound_share"], "time_set_by": worst["time_set_by"]}


def _row(name: str, ranks: list[dict], reference: dict, local_step: float | None) -> dict:
    step = statistics.mean(r["median_step_s"] for r in ranks)
    sent = [r["wire_bytes_per_step"] for r in ranks if r["wire_bytes_per_step"]]  # async: the server sends none
    diff = (ranks[0]["params"] - reference["params"]).abs().max().item()
    return {
        "strategy": name, "step_time_s": step,
        "exposed_comm_s": None if local_step is None else max(0.0, step - local_step),
        "bytes_per_step": statistics.mean(sent) if sent else 0.0,
        "final_loss": ranks[0]["losses"][-1], "max_abs_diff_vs_single": diff,
        "replicas_identical": all(r["replica_spread"] == 0.0 for r in ranks),
        "exact": name in EXACT, "link_report": link_report(ranks),
    }


def compare_strategies(world_size: int | None = None, model: str = "mlp", steps: int = 20, accum_steps: int = 1,
                       bucket_mb: float | None = None, strategies=DEFAULT_STRATEGIES, optimizer: str = "sgd",
                       backend: str = "auto", device: str = "auto", timeout: float = 600.0, interleave: bool = False,
                       link=None, **options) -> dict:
    """Train every strategy for ``steps`` steps on ``world_size`` ranks; return a table and the raw runs.

    ``interleave=True`` runs the synchronous strategies step by step side by side (fair timing
    ratios on a busy machine; the command line does this); the default runs them one after another,
    which keeps each strategy's timeline free of gaps for the Gantt plots.
    """
    strategies = list(strategies)
    link = resolve_link(link)
    world_size, placement = resolve_world(world_size, backend, device)
    if "async" in strategies and world_size < 2:
        strategies.remove("async")  # a parameter server needs at least one worker besides itself
    base = TrainConfig(model=model, steps=steps, accum_steps=accum_steps, bucket_mb=bucket_mb,
                       optimizer=optimizer, **options)
    configs = [replace(base, strategy=s, link=None if s == "async" else link).check(world_size) for s in strategies]
    per_rank = launch(_train_each, world_size, args=(configs, interleave), backend=placement.backend,
                      device=placement.device_type, timeout=timeout)
    runs = {s: [per_rank[r][i] for r in range(world_size)] for i, s in enumerate(strategies)}
    on = reference_device(placement)  # the ranks' kind of device: see train.py on tolerances
    references = {world_size: train_single_process(base, world_size, device=on)}
    if "async" in strategies:  # its global batch is shared by the W-1 workers
        references[world_size - 1] = train_single_process(base, world_size - 1, device=on)
    local_step = statistics.mean(r["median_step_s"] for r in runs["local"]) if "local" in runs else None
    rows = [_row(s, runs[s], references[world_size - 1 if s == "async" else world_size], local_step)
            for s in strategies]
    return {"world_size": world_size, "backend": placement.backend, "device": placement.device_type,
            "model": model, "steps": steps, "accum_steps": accum_steps, "bucket_mb": base.bucket_mb,
            "optimizer": optimizer, "link": None if link is None else link.as_dict(), "rows": rows, "runs": runs,
            "reference_losses": references[world_size]["losses"]}


def run_strategy(world_size: int | None, config: TrainConfig, backend: str = "auto", device: str = "auto",
                 timeout: float = 300.0) -> dict:
    """Train one strategy; return its per-rank results and the single-process reference."""
    world_size, placement = resolve_world(world_size, backend, device)
    config.check(world_size)
    ranks = launch(train_on_rank, world_size, args=(config,), backend=placement.backend,
                   device=placement.device_type, timeout=timeout)
    workers = world_size - 1 if config.strategy == "async" else world_size
    return {"ranks": ranks, "reference": train_single_process(config, workers, device=reference_device(placement))}
