"""Lesson 01: the average of the replicas' gradients *is* the large-batch gradient.

Data parallelism rests on one identity. Every rank holds the same weights and computes the mean
loss over its own B samples; because a mean over W equal parts is the mean of the parts' means,

    (1/W) sum_r grad( mean over shard r )  =  grad( mean over all B x W samples ),

so one all-reduce that averages the gradients gives every rank exactly the gradient that one
process would compute on the global batch (up to float32 rounding: the sum is taken in a different
order). With K accumulated micro-batches per rank the same argument covers B x W x K samples.

``gradient_equivalence`` checks this on real ranks: each rank computes its own shard's gradient,
the ranks all-reduce and average, and the caller compares the result with one process computing
the gradient of the whole global batch. It also reports how far each rank's *own* gradient is
from the global one, which shows why the all-reduce is needed at all.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.utils import parameters_to_vector

from .. import validate

from ..ranks import context
from ..ranks.launcher import launch
from ..ranks.world import World, resolve_world
from ..replica.data import global_batches, loss_fn, make_dataset, rank_microbatches, sample_batch
from ..replica.models import build_model, check_model_name

# float32 sums in a different order agree to ~1e-7 relative; 1e-5 leaves room for deeper models.
GRAD_REL_TOLERANCE = 1e-5


def _flat_grad(model) -> torch.Tensor:
    return parameters_to_vector(p.grad for p in model.parameters()).detach()


def _gradient(model, criterion, dataset, micro_batches, device) -> torch.Tensor:
    """Gradient of the mean loss over ``micro_batches`` (each of equal size): accumulate loss / K."""
    model.zero_grad()
    for indices in micro_batches:
        x, y = (t.to(device) for t in sample_batch(dataset, indices))
        (criterion(model(x), y) / len(micro_batches)).backward()
    return _flat_grad(model)


def _rank_gradient(model_name: str, batch_per_rank: int, accum_steps: int, seed: int) -> dict:
    rank, world, device = dist.get_rank(), dist.get_world_size(), context.device()
    if rank == 0:
        context.report_progress(0, total=2, desc="gradients")
    model = build_model(model_name, seed=seed).to(device)
    dataset = make_dataset(model_name, batch_per_rank * world * accum_steps, seed=seed)
    batch = next(iter(global_batches(dataset, batch_per_rank, world, accum_steps, seed=seed)))
    shard = rank_microbatches(batch, rank, world, batch_per_rank, accum_steps)
    local = _gradient(model, loss_fn(model_name), dataset, shard, device)
    if rank == 0:
        context.report_progress(1)
    averaged = local.clone()
    dist.all_reduce(averaged)  # sum over ranks ...
    averaged /= world          # ... then divide: the mean (ReduceOp.AVG would do both at once)
    if rank == 0:
        context.report_progress(1)
    return {"rank": rank, "shard": [i for micro in shard for i in micro], "global_batch": list(batch),
            "local": local.cpu(), "averaged": averaged.cpu() if rank == 0 else None}


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def gradient_equivalence(world_size: int | World | None = 2, batch_per_rank: int = 16, model: str = "mlp",
                         accum_steps: int = 1, seed: int = 0, backend: str = "auto",
                         device: str = "auto") -> dict:
    """Average the W ranks' shard gradients and compare them with the global-batch gradient.

    Returns plain data::

        {"world_size", "batch_per_rank", "accum_steps", "global_batch" (= B x W x K), "model",
         "num_params", "shards": [[sample indices of rank r], ...],
         "max_abs_diff", "rel_error"            # averaged vs single process on the global batch
         "norm_single", "norm_averaged",        # L2 norms of the two gradients
         "local_rel_errors": [per rank: |own gradient - global| / |global|],
         "tolerance": GRAD_REL_TOLERANCE, "backend", "device"}
    """
    check_model_name(model)
    validate.integer("batch_per_rank", batch_per_rank, low=1)
    validate.integer("accum_steps", accum_steps, low=1)
    world = resolve_world(world_size, backend, device)
    ranks = launch(_rank_gradient, world, args=(model, batch_per_rank, accum_steps, seed))
    # The reference: one process, one model, the whole global batch in a single forward and backward.
    reference_model = build_model(model, seed=seed)
    dataset = make_dataset(model, batch_per_rank * world.size * accum_steps, seed=seed)
    single = _gradient(reference_model, loss_fn(model), dataset, [ranks[0]["global_batch"]], "cpu")
    averaged = ranks[0]["averaged"]
    return {
        "world_size": world.size, "batch_per_rank": batch_per_rank, "accum_steps": accum_steps,
        "global_batch": len(ranks[0]["global_batch"]), "model": model, "num_params": single.numel(),
        "shards": [r["shard"] for r in ranks],
        "max_abs_diff": (averaged - single).abs().max().item(), "rel_error": _relative(averaged, single),
        "norm_single": single.norm().item(), "norm_averaged": averaged.norm().item(),
        "local_rel_errors": [_relative(r["local"], single) for r in ranks],
        "tolerance": GRAD_REL_TOLERANCE, "backend": world.backend, "device": world.device_type,
    }
