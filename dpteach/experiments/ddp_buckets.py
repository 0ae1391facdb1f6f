"""Lesson 03: the buckets torch's DDP really builds, iteration by iteration, beside the course's rule.

``dpteach/replica/buckets.py`` keeps one simple rule (reverse parameter order, close a bucket once it
reaches the cap, a smaller first cap). DDP today does more, and what it does depends on its options
(torch 2.13, ``nn/parallel/distributed.py``: ``_BucketCapacityConfig``; C++ reducer
``torch/csrc/distributed/c10d/reducer.cpp``):

* ``find_unused_parameters=False`` (the default) or ``static_graph=True``: before the first
  iteration DDP does not know the order in which gradients will arrive, so it puts **every
  parameter in one bucket**. During that first backward the reducer records the order in which
  gradients actually became ready; before the second forward it **rebuilds** its buckets once, in
  that order (``Reducer::rebuild_buckets``), and broadcasts the new assignment from rank 0 so that
  every rank launches the same buckets in the same order (``sync_bucket_indices``). With
  ``static_graph=True`` the rebuild comes one iteration later.
* The first rebuilt bucket is capped at 1 MiB (``dist._DEFAULT_FIRST_BUCKET_BYTES``) **only when
  ``bucket_cap_mb`` is left at its default** (25 MiB); pass any ``bucket_cap_mb`` and the first
  bucket gets that same cap.
* ``find_unused_parameters=True``: no rebuild. The assignment is cut in *definition* order with the
  caps [1 MiB, 25 MiB] and the list is then reversed, so the small bucket holds the parameters
  defined first and is reduced **last**. DDP's comment says why: those gradients should not spill
  into a large bucket and add latency after gradient computation finishes.

:func:`ddp_bucket_assignment` wraps a course model in DDP and reads what DDP did: a comm hook records
each bucket it is handed (index, parameters, bytes) in every iteration, the profiler counts the
collectives each iteration issues, and ``_get_ddp_logging_data()`` gives DDP's own account. The
course's rule is applied with the same caps, so the two can be compared bucket by bucket.
"""
from __future__ import annotations

import torch.distributed as dist

from .. import validate

from ..ranks import context
from ..ranks.launcher import launch
from ..ranks.world import World, resolve_world
from ..replica.buckets import MB, assign_buckets
from ..replica.data import loss_fn, make_dataset, sample_batch
from ..replica.models import build_model, check_model_name
from ..sync.ddp import wrap_ddp
from ..training.accounting import profiled

DEFAULT_CAP_MB = 25.0  # DDP's bucket_cap_mb default
DEFAULT_FIRST_CAP_BYTES = getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", 1024 * 1024)
LOGGED = ("bucket_sizes", "rebuilt_bucket_sizes", "rebuilt_per_bucket_param_indices", "has_rebuilt_buckets")


# The process-group backends record each collective as "<backend>:<collective>" on the host.
def _on_rank(model_name: str, bucket_cap_mb, find_unused: bool, iterations: int, batch: int, seed: int) -> dict:
    device, rank, world = context.device(), dist.get_rank(), dist.get_world_size()
    model = build_model(model_name, seed=seed).to(device)
    name_of = {p.data_ptr(): n for n, p in model.named_parameters()}
    ready: list[str] = []
    for n, p in model.named_parameters():  # the order in which gradients become ready, as DDP sees it
        p.register_post_accumulate_grad_hook(lambda param, n=n: ready.append(n))
    ddp = wrap_ddp(model, bucket_cap_mb=bucket_cap_mb, find_unused_parameters=find_unused)
    handed: list[dict] = []

    def recording_hook(state, bucket):  # DDP's default (average by all-reduce), plus a record
        buffer = bucket.buffer()
        handed.append({"index": bucket.index(), "params": [name_of[p.data_ptr()] for p in bucket.parameters()],
                       "bytes": buffer.numel() * buffer.element_size()})
        buffer.div_(world)
        return dist.all_reduce(buffer, async_op=True).get_future().then(lambda fut: fut.value()[0])
    ddp.register_comm_hook(None, recording_hook)
    dataset, criterion = make_dataset(model_name, batch * world, seed=seed), loss_fn(model_name)
    x, y = (t.to(device) for t in sample_batch(dataset, range(rank * batch, (rank + 1) * batch)))
    per_iteration = []
    for it in range(iterations):
        handed.clear()
        ready.clear()
        _, issued = profiled(lambda: criterion(ddp(x), y).backward())
        context.synchronize()
        per_iteration.append({"iteration": it + 1, "buckets": list(handed), "ready_order": list(ready),
                              "collectives": issued})
    logged = ddp._get_ddp_logging_data()
    return {"iterations": per_iteration, "logging": {key: logged.get(key) for key in LOGGED}}


def ddp_bucket_assignment(model: str = "mlp", bucket_cap_mb: float | None = None,
                          find_unused_parameters: bool = False, iterations: int = 3, world_size: int | World | None = 2,
                          batch_per_rank: int = 8, seed: int = 0, backend: str = "auto",
                          device: str = "auto") -> dict:
    """The buckets DDP builds for ``model`` in each of ``iterations`` iterations, and the course's rule.

    ``bucket_cap_mb=None`` leaves DDP's default (25 MiB, first bucket 1 MiB). Returns ``{"model",
    "world_size", "backend", "device", "bucket_cap_mb", "find_unused_parameters", "cap_bytes",
    "first_cap_bytes", "parameters": [names in definition order], "param_bytes": {name: bytes},
    "iterations": [{"iteration", "buckets": [{"index", "params", "bytes"}], "ready_order",
    "collectives": [names, e.g. "all_reduce"]}], "logging": {DDP's own fields}, "rebuilt" (bool),
    "course_rule": [{"params", "bytes"}], "same_as_course_rule" (DDP's last iteration vs the rule),
    "ranks_agree" (every rank was handed the same buckets)}``.
    """
    check_model_name(model)
    validate.optional(validate.number, "bucket_cap_mb", bucket_cap_mb, above=0, unit="a size in MiB",
                      why=f", or None for DDP's default ({DEFAULT_CAP_MB:g} MiB)")
    validate.choice("find_unused_parameters", find_unused_parameters, (True, False))
    validate.integer("iterations", iterations, low=2, why=" (DDP rebuilds its buckets after the first one)")
    world = resolve_world(world_size, backend, device)
    per_rank = launch(_on_rank, world, args=(model, bucket_cap_mb, find_unused_parameters, iterations,
                                                  batch_per_rank, seed), timeout=120)
    mine = per_rank[0]
    named = [(n, p) for n, p in build_model(model, seed=seed).named_parameters()]
    cap = (DEFAULT_CAP_MB if bucket_cap_mb is None else bucket_cap_mb) * MB
    first_cap = DEFAULT_FIRST_CAP_BYTES if bucket_cap_mb is None else cap
    size = {n: p.numel() * p.element_size() for n, p in named}
    rule = [[named[i][0] for i in bucket]
            for bucket in assign_buckets([p for _, p in named], cap / MB, first_cap / MB)]
    last = [b["params"] for b in mine["iterations"][-1]["buckets"]]
    return {"model": model, "world_size": world.size, "backend": world.backend,
            "device": world.device_type, "bucket_cap_mb": bucket_cap_mb,
            "find_unused_parameters": find_unused_parameters, "cap_bytes": int(cap), "first_cap_bytes": int(first_cap),
            "parameters": [n for n, _ in named], "param_bytes": size, "iterations": mine["iterations"],
            "logging": mine["logging"], "rebuilt": bool(mine["logging"].get("has_rebuilt_buckets")),
            "course_rule": [{"params": b, "bytes": sum(size[n] for n in b)} for b in rule],
            "same_as_course_rule": last == rule,
            "ranks_agree": all([it["buckets"] for it in r["iterations"]] == [it["buckets"] for it in mine["iterations"]]
                               for r in per_rank)}
