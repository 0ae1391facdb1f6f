"""Lesson 03: two DDP options a learner meets in real code, each measured on real ranks.

**Parameters that get no gradient** (``unused_parameters``). DDP launches a bucket's all-reduce
when the autograd hook of *every* parameter in it has fired. A parameter that took no part in the
forward pass never fires its hook, so its bucket never launches and the reduction never
finishes. With the default ``find_unused_parameters=False`` nothing complains during that
backward; the reducer notices at the start of the next iteration and raises ("Expected to have
finished reduction in the prior iteration before starting a new one"). Two ways out
(torch 2.13, ``nn/parallel/distributed.py`` docstring; ``reducer.cpp``):

* ``find_unused_parameters=True``: after every forward DDP walks the autograd graph from the
  outputs and marks the parameters it cannot reach as ready, and it all-reduces a per-parameter
  "used" bitmap every iteration so that all ranks agree (reducer Note [Skip allreducing
  local_used_maps_dev]). Both cost something every iteration;
* ``static_graph=True``: the user promises that the set of used parameters (and the graph) never
  changes; DDP learns it in the first iteration and needs no traversal afterwards.

**Gradients as views into the buckets** (``bucket_view_memory``). By default each ``.grad`` has its
own storage and DDP keeps flat bucket buffers beside it: the gradient is copied into the bucket,
reduced there, and copied back - two copies of every gradient. ``gradient_as_bucket_view=True``
makes every ``.grad`` a view into its bucket, which saves one copy (the DDP docstring: "reduce peak
memory usage, where the saved memory size will be equal to the total gradients size").
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from .. import validate

from ..measure import ranking, spread, turned
from ..ranks import context
from ..ranks.launcher import launch
from ..ranks.world import World, resolve_world
from ..replica.build import flat_weights, replica_spread
from ..replica.data import loss_fn, make_dataset, sample_batch
from ..replica.models import NUM_CLASSES, build_model, check_model_name
from ..sync.ddp import wrap_ddp
from ..training.accounting import profiled


class WithSpareHead(nn.Module):
    """A course model plus a head that this phase of training never calls (an auxiliary or
    fine-tuning head is the usual culprit): its two parameters never get a gradient."""

    def __init__(self, model_name: str, seed: int = 0):
        super().__init__()
        self.body = build_model(model_name, seed=seed)
        self.spare_head = nn.Linear(NUM_CLASSES, NUM_CLASSES)

    def forward(self, x):
        return self.body(x)


def _batch(model_name: str, batch: int, step: int, seed: int):
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = make_dataset(model_name, batch * world * 2, seed=seed)
    start = ((step % 2) * world + rank) * batch
    return (t.to(context.device()) for t in sample_batch(dataset, range(start, start + batch)))


def _flat_grads(module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in module.parameters() if p.grad is not None]).cpu()


def _default_fails(model_name: str, batch: int, seed: int) -> dict:
    """Default DDP with a spare head: what the first iteration does, and what the second one says."""
    module = WithSpareHead(model_name, seed)
    ddp, criterion = wrap_ddp(module), loss_fn(model_name)
    x, y = _batch(model_name, batch, 0, seed)
    _, issued = profiled(lambda: criterion(ddp(x), y).backward())
    out = {"first_collectives": issued, "first_grad_spread": replica_spread(_flat_grads(module)), "error": None}
    x, y = _batch(model_name, batch, 1, seed)
    try:
        criterion(ddp(x), y).backward()
    except RuntimeError as exc:
        out["error"] = str(exc).strip().split("\n")[0]
    return out


def _unused_on_rank(model_name: str, steps: int, batch: int, seed: int) -> dict:
    failed = _default_fails(model_name, batch, seed)
    runs = {"no spare head": wrap_ddp(build_model(model_name, seed=seed)),
            "find_unused_parameters": wrap_ddp(WithSpareHead(model_name, seed), find_unused_parameters=True),
            "static_graph": wrap_ddp(WithSpareHead(model_name, seed), static_graph=True)}
    optimizers = {name: torch.optim.SGD(ddp.parameters(), lr=0.01) for name, ddp in runs.items()}
    criterion = loss_fn(model_name)
    times = {name: [] for name in runs}
    collectives = {name: [] for name in runs}
    # The first three steps (buckets rebuilt; static_graph learns its graph) and the last one are
    # profiled to count collectives; the steps between them are timed without the profiler.
    profiled_steps = {0, 1, 2, steps - 1}
    for step in range(steps):
        x, y = _batch(model_name, batch, step, seed)
        for name in turned(list(runs), step):  # interleaved, the order turning each step: load falls on all alike
            ddp = runs[name]
            def one_step():
                optimizers[name].zero_grad(set_to_none=True)
                criterion(ddp(x), y).backward()
                optimizers[name].step()
            if step in profiled_steps:
                collectives[name].append(len(profiled(one_step)[1]))
                continue
            context.synchronize()
            start = time.perf_counter()
            one_step()
            context.synchronize()
            times[name].append(time.perf_counter() - start)
    steps_of = {name: spread(times[name]) for name in runs}
    rows = []
    for name, ddp in runs.items():
        body = ddp.module.body if isinstance(ddp.module, WithSpareHead) else ddp.module
        spare = ddp.module.spare_head if isinstance(ddp.module, WithSpareHead) else None
        rows.append({"setting": name, "median_step_s": steps_of[name].median, "step": steps_of[name].as_dict(),
                     "collectives_per_step": collectives[name],
                     "spare_grads_none": None if spare is None else all(p.grad is None for p in spare.parameters()),
                     "replica_spread": replica_spread(flat_weights(body))})
    return {"default": failed, "rows": rows, "ranking": ranking(steps_of).as_dict("ms", scale=1e3, digits=2)}


def unused_parameters(world_size: int | World | None = 2, model: str = "mlp", steps: int = 12, batch_per_rank: int = 16,
                      seed: int = 0, backend: str = "auto", device: str = "auto") -> dict:
    """A model whose spare head gets no gradient, under DDP's default, ``find_unused_parameters`` and
    ``static_graph``, with the same model without the spare head as the baseline.

    Returns ``{"world_size", "backend", "device", "model", "steps", "default": {"first_collectives"
    (collectives issued by the first backward), "first_grad_spread" (largest gradient difference
    between ranks after it: not averaged if > 0), "error" (the first line DDP raised in the second
    iteration, or None)}, "rows": [{"setting", "median_step_s", "step" (every timed step's median and
    interval: ``dpteach.measure.Spread.as_dict``), "collectives_per_step" (in steps 1, 2, 3 and the last,
    profiled), "spare_grads_none", "replica_spread"}], "ranking": {"order", "leaders", "winner",
    "sentence"}}``. The three settings take their steps in turn (one step of each, then the next), so load
    on the machine falls on all three alike; ``ranking`` names a faster one only where the intervals of
    their steps separate (``dpteach.measure.ranking``).
    """
    check_model_name(model)
    validate.integer("steps", steps, low=6)
    validate.integer("batch_per_rank", batch_per_rank, low=1)
    world = resolve_world(world_size, backend, device)
    per_rank = launch(_unused_on_rank, world, args=(model, steps, batch_per_rank, seed), timeout=180)
    return {"world_size": world.size, "backend": world.backend, "device": world.device_type,
            "model": model, "steps": steps, **per_rank[0]}


def _storage(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def _views_on_rank(model_name: str, batch: int, seed: int) -> list[dict]:
    rows = []
    for as_view in (False, True):
        model = build_model(model_name, seed=seed)
        ddp, criterion = wrap_ddp(model, gradient_as_bucket_view=as_view), loss_fn(model_name)
        buckets: dict[int, tuple[int, int]] = {}

        def recording_hook(state, bucket):
            buffer = bucket.buffer()
            buckets[bucket.index()] = _storage(buffer)
            buffer.div_(dist.get_world_size())
            return dist.all_reduce(buffer, async_op=True).get_future().then(lambda fut: fut.value()[0])
        ddp.register_comm_hook(None, recording_hook)
        for step in range(2):  # the second iteration runs on the rebuilt buckets
            buckets.clear()
            model.zero_grad(set_to_none=False)
            x, y = _batch(model_name, batch, step, seed)
            criterion(ddp(x), y).backward()
        context.synchronize()
        grads = [_storage(p.grad) for p in model.parameters()]
        bucket_storages = set(buckets.values())
        distinct = set(grads) | bucket_storages
        rows.append({"gradient_as_bucket_view": as_view,
                     "grad_bytes": sum(p.grad.numel() * p.grad.element_size() for p in model.parameters()),
                     "bucket_bytes": sum(nbytes for _, nbytes in bucket_storages),
                     "distinct_bytes": sum(nbytes for _, nbytes in distinct),
                     "grads_in_buckets": sum(g in bucket_storages for g in grads), "num_grads": len(grads),
                     "num_buckets": len(bucket_storages)})
    return rows


def bucket_view_memory(world_size: int | World | None = 2, model: str = "mlp", batch_per_rank: int = 8, seed: int = 0,
                       backend: str = "auto", device: str = "auto") -> dict:
    """Gradient memory of DDP with ``gradient_as_bucket_view`` off and on, read from the tensors' storages.

    Returns ``{"world_size", "backend", "device", "model", "rows": [{"gradient_as_bucket_view",
    "grad_bytes" (the .grad tensors), "bucket_bytes" (DDP's flat buffers), "distinct_bytes" (memory
    the two really occupy: storages counted once), "grads_in_buckets" (how many .grad tensors live in
    a bucket's storage), "num_grads", "num_buckets"}]}``.
    """
    check_model_name(model)
    world = resolve_world(world_size, backend, device)
    per_rank = launch(_views_on_rank, world, args=(model, batch_per_rank, seed), timeout=120)
    return {"world_size": world.size, "backend": world.backend, "device": world.device_type,
            "model": model, "rows": per_rank[0]}
