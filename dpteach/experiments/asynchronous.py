"""``async_staleness``: a parameter server that never waits, and what it costs.

``dpteach/sync/async_ps.py`` runs rank 0 as a parameter server and ranks 1..W-1 as workers that
push a gradient and pull fresh weights without any barrier (Dean et al., "Large Scale Distributed
Deep Networks", 2012). This experiment runs, in ONE world:

* synchronous training (``bucketed``: all-reduce, every rank waits for every other) twice with the
  same seed - the runs are bit-for-bit identical;
* asynchronous training with one worker made slow (``slow_ms`` of sleep per update,
  ``TrainConfig.slow_rank``). Each gradient's *staleness* is how many updates the server applied
  between the worker's pull and its push; the slow worker's gradients are the stalest;
* asynchronous training ``repeats`` times with the same seed and equally fast workers, which race:
  the order in which their pushes arrive depends on timing, so the runs end with different weights;
* the slow-worker run again with ``max_staleness``: the server drops pushes staler than the cap and
  the worker retries on fresh weights (a drop policy; stale-synchronous parallel, Ho et al. 2013,
  makes the fastest worker wait instead and drops nothing).

To compare learning, rank 0 keeps a copy of the weights after every optimizer step, with the time
(a global optimizer post-step hook, ``register_optimizer_step_post_hook``: the trainer itself is not
changed), and evaluates every copy on a fixed held-out batch *after* the run, so that evaluation
never delays training. Asynchronous pushes each carry B samples; a synchronous step carries B x W.
The slow worker also gets a synchronous run (``sync, rank W-1 slow``): held-out loss against
wall-clock time then shows what asynchrony buys - the fast workers never wait - and, next to the
staleness and irreproducibility, what it costs.
"""
from __future__ import annotations

import time
from dataclasses import replace

import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters
from torch.optim.optimizer import register_optimizer_step_post_hook

from .. import validate

from ..ranks import context
from ..ranks.launcher import launch
from ..ranks.world import World, resolve_world
from ..replica.data import loss_fn, make_dataset
from ..replica.models import build_model
from ..training.train import TrainConfig, train_on_rank

EVAL_SAMPLES = 256
EVAL_SEED_OFFSET = 1000  # a held-out sample of the same task (dpteach.replica.data: the seed picks samples, not the task)


def _snapshot_recorder(snapshots: list):
    """A post-step hook that keeps (clock time, a copy of the weights) after every optimizer step."""
    def hook(optimizer, args, kwargs):
        params = [p for group in optimizer.param_groups for p in group["params"]]
        snapshots.append((time.perf_counter(), parameters_to_vector(params).detach().clone()))
    return hook


def _evaluate(model_name: str, seed: int, snapshots: list) -> list[tuple[float, float]]:
    """Held-out loss of every kept copy of the weights: (seconds, loss), computed after training."""
    device = context.device()
    model = build_model(model_name, seed=seed).to(device)
    x, y = (t.to(device) for t in make_dataset(model_name, EVAL_SAMPLES, seed=seed + EVAL_SEED_OFFSET).tensors)
    criterion, curve = loss_fn(model_name), []
    with torch.no_grad():
        for seconds, weights in snapshots:
            vector_to_parameters(weights, model.parameters())
            curve.append((seconds, criterion(model(x), y).item()))
    return curve


def _on_rank(configs: list[TrainConfig]) -> list[dict]:
    rank = context.rank()
    if rank == 0:
        context.report_progress(0, total=len(configs), desc="sync and async runs")
    results = []
    for config in configs:
        snapshots = []
        handle = register_optimizer_step_post_hook(_snapshot_recorder(snapshots)) if rank == 0 else None
        try:
            result = train_on_rank(config)
        finally:
            if handle is not None:
                handle.remove()
        since_start = [(t - result["started_at"], weights) for t, weights in snapshots]  # from the first step
        result["eval_curve"] = _evaluate(config.model, config.seed, since_start) if rank == 0 else []
        result.pop("spans")
        results.append(result)
        if rank == 0:
            context.report_progress(1)
    return results


def _order(server: dict) -> list[tuple[int, int]]:
    """The order in which the server handled pushes: (worker, staleness) pairs."""
    return [(s["worker"], s["staleness"]) for s in server["staleness"]]


def async_staleness(world_size: int | World | None = None, steps: int = 12, slow_ms: float = 60.0,
                    max_staleness: int | None = 1, repeats: int = 2, model: str = "mlp", batch_per_rank: int = 16,
                    seed: int = 0, backend: str = "auto", device: str = "auto", timeout: float = 600.0) -> dict:
    """Run sync twice, async with a slow worker, async ``repeats`` times with equal workers, and bounded async.

    Returns ``{"world_size", "backend", "device", "model", "steps", "slow_rank", "slow_ms", "max_staleness",
    "batch_per_rank", "runs": [{"label", "kind", "eval_curve": [(s, loss)], "samples_per_update", ...}],
    "sync_repeat_diff", "async_repeat_diffs", "async_orders_differ", "staleness": {worker: [...]},
    "pushes_alone", "bounded": {...}}``. ``staleness`` (slow-worker run) leaves out the pushes a worker
    computed after all the others had finished (see ``_in_company``).
    """
    world = resolve_world(world_size, backend, device)
    validate.ranks(world, 3, "async needs a server and at least two workers (one slow, one not)")
    validate.integer("repeats", repeats, low=2, why=" (comparing runs needs two or more)")
    slow_rank = world.size - 1
    base = TrainConfig(model=model, steps=steps, batch_per_rank=batch_per_rank, seed=seed)
    slow = replace(base, strategy="async", slow_rank=slow_rank, slow_ms=float(slow_ms))
    labelled = [("sync run 1", "sync", replace(base, strategy="bucketed")),
                ("sync run 2", "sync", replace(base, strategy="bucketed")),
                (f"sync, rank {slow_rank} slow", "sync_slow",
                 replace(base, strategy="bucketed", slow_rank=slow_rank, slow_ms=float(slow_ms))),
                (f"async, rank {slow_rank} slow", "slow", slow)]
    labelled += [(f"async run {i + 1} (equal workers)", "async", replace(base, strategy="async"))
                 for i in range(repeats)]
    if max_staleness is not None:
        labelled.append((f"async, rank {slow_rank} slow, max_staleness={max_staleness}", "bounded",
                         replace(slow, knobs={"max_staleness": max_staleness})))
    configs = [c.check(world.size) for _, _, c in labelled]
    per_rank = launch(_on_rank, world, args=(configs,), timeout=timeout)
    runs = []
    for i, (label, kind, config) in enumerate(labelled):
        server = per_rank[0][i]
        runs.append({"label": label, "kind": kind, "eval_curve": server["eval_curve"],
                     "samples_per_update": batch_per_rank * (world.size if kind.startswith("sync") else 1),
                     "final_eval_loss": server["eval_curve"][-1][1] if server["eval_curve"] else None,
                     "params": server["params"], "async": server.get("async")})
    syncs = [r for r in runs if r["kind"] == "sync"]
    repeated = [r for r in runs if r["kind"] == "async"]
    slow_log = next(r for r in runs if r["kind"] == "slow")["async"]["staleness"]
    company = _in_company(slow_log)
    staleness = {}
    for push, counted in zip(slow_log, company):
        if counted:
            staleness.setdefault(push["worker"], []).append(push["staleness"])
    result = {
        "world_size": world.size, "backend": world.backend, "device": world.device_type, "model": model,
        "steps": steps, "slow_rank": slow_rank, "slow_ms": float(slow_ms), "max_staleness": max_staleness,
        "batch_per_rank": batch_per_rank, "runs": [{k: v for k, v in r.items() if k != "params"} for r in runs],
        "sync_repeat_diff": (syncs[0]["params"] - syncs[1]["params"]).abs().max().item(),
        "async_repeat_diffs": [(repeated[0]["params"] - a["params"]).abs().max().item() for a in repeated[1:]],
        "async_orders_differ": [_order(repeated[0]["async"]) != _order(a["async"]) for a in repeated[1:]],
        "staleness": dict(sorted(staleness.items())),
        "pushes_alone": company.count(False),
        "bounded": None,
    }
    bounded = [r for r in runs if r["kind"] == "bounded"]
    if bounded:
        server = bounded[0]["async"]
        result["bounded"] = {"max_staleness": max_staleness, "applied": server["applied"],
                             "dropped": server["dropped"], "pushes": len(server["staleness"]),
                             "staleness": [s["staleness"] for s in server["staleness"]]}
    return result


def _in_company(log: list[dict]) -> list[bool]:
    """For each push: was it computed while some other worker was still working?

    Every worker makes the same number of pushes, so the fast ones finish first and the slow one then
    pushes alone, with staleness 0 - a tail that says nothing about workers running side by side. A
    push is alone when the worker's previous push came after every other worker's last one.
    """
    last = {}
    for index, push in enumerate(log):
        last[push["worker"]] = index
    previous, flags = {}, []
    for index, push in enumerate(log):
        worker = push["worker"]
        others = [i for w, i in last.items() if w != worker]
        flags.append(not others or previous.get(worker, -1) < max(others))
        previous[worker] = index
    return flags
