"""The course's PowerSGD and torch's own hook, fed the same gradients on one rank (:func:`on_rank`); lesson 14's
``powersgd_against_torch`` runs it in a world of its own, ``sending_less`` inside the world its methods train in.

On real ranks, every step, each rank computes the MLP's gradients on its own batch and hands the same
gradients to both:

* torch's ``powerSGD_hook`` (``torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py``) with a
  ``PowerSGDState`` of the same rank and start and its other defaults (error feedback and warm start on,
  ``random_seed=0``). DDP normally calls it once per bucket; ``dist.GradBucket`` has no Python constructor
  ("No constructor defined"), so the hook is given a stand-in that answers the four questions it asks -
  ``buffer()``, ``index()``, ``gradients()``, ``is_last()`` - about the course's own buckets
  (``replica.buckets.build_buckets``). Both then see the same buckets, in the same order, and draw their
  random Q from the same seeds. Each bucket's future is waited for before the next bucket's hook runs:
  the hook launches its P and Q all-reduces from callbacks, and two buckets in flight at once could
  reach the ranks' collectives in different orders.
* the course's ``sync/powersgd.py``, through ``finish(step)``, as the trainer calls it.

Then the optimizer steps on the course's result, so the next step's gradients are new and warm start
and error feedback carry real state from step to step. Returned per step: max |torch - course| over
every gradient element and every rank (next to the largest gradient element, for scale), and the bytes
each put on the wire - both counted the same way, from the tensors handed to ``dist.all_reduce`` in
that step, at the ring's 2(W-1)/W per byte (as ``network/comm.py`` counts) - next to what one plain
all-reduce of every gradient would put there.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook

from ..network.costmodel import busbw_factor
from ..ranks import context
from ..replica.buckets import build_buckets
from ..replica.data import loss_fn, make_dataset, sample_batch
from ..replica.models import SPECS, build_model
from ..replica.timeline import Timeline
from ..sync.powersgd import PowerSGD

MODEL, BATCH = "mlp", 32


class _HandBucket:
    """What ``powerSGD_hook`` reads of a ``dist.GradBucket``, answered for one of the course's buckets."""

    def __init__(self, bucket, count: int):
        self.bucket, self.count = bucket, count

    def buffer(self):
        return self.bucket.buffer

    def index(self):
        return self.bucket.index

    def gradients(self):
        return list(self.bucket.views)  # views into buffer(), as DDP's are

    def parameters(self):
        return list(self.bucket.params)

    def is_last(self):  # the hook counts a step when the last bucket of it is done
        return self.bucket.index == self.count - 1


@contextmanager
def _all_reduces(sizes: list):
    """Note the bytes of every tensor handed to ``dist.all_reduce`` meanwhile (torch's hook or ours)."""
    real = dist.all_reduce

    def counted(tensor, *args, **kwargs):
        sizes.append(tensor.numel() * tensor.element_size())
        return real(tensor, *args, **kwargs)
    dist.all_reduce = counted
    try:
        yield
    finally:
        dist.all_reduce = real


def on_rank(rank: int, start: int, steps: int, seed: int) -> list[dict]:
    device, world, me = context.device(), context.world_size(), context.rank()
    model = build_model(MODEL, seed=seed, device=device)
    data, criterion = make_dataset(MODEL, steps * world * BATCH, seed=seed), loss_fn(MODEL)
    optimizer = torch.optim.SGD(model.parameters(), lr=SPECS[MODEL].lr)
    bucket_mb = SPECS[MODEL].bucket_mb
    ours = PowerSGD(model, Timeline(device), bucket_mb=bucket_mb,
                    **PowerSGD.settings({"powersgd_rank": rank, "powersgd_start": start}))
    theirs = build_buckets(model, bucket_mb)  # buffers of their own, laid out as ours
    state = PowerSGDState(process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=start)
    ring, plain = busbw_factor(world), sum(b.nbytes for b in theirs)
    rows = []
    for step in range(steps):
        optimizer.zero_grad()
        first = (step * world + me) * BATCH
        x, y = (t.to(device) for t in sample_batch(data, range(first, first + BATCH)))
        criterion(model(x), y).backward()
        torch_sizes, course_sizes = [], []
        with _all_reduces(torch_sizes):
            for bucket in theirs:
                bucket.copy_in()
                powerSGD_hook(state, _HandBucket(bucket, len(theirs))).wait()
        with _all_reduces(course_sizes):
            ours.start_step(step)
            ours.finish(step)
        diff = max((p.grad - view).abs().max().item() for b in theirs for p, view in zip(b.params, b.views))
        rows.append({"step": step, "compressed": step >= start, "max_abs_diff": diff,
                     "max_abs_grad": max(p.grad.abs().max().item() for p in model.parameters()),
                     "torch_bytes": sum(int(n * ring) for n in torch_sizes),
                     "course_bytes": sum(int(n * ring) for n in course_sizes), "course_comm_bytes": ours.wire_bytes,
                     "uncompressed_bytes": int(plain * ring),
                     "torch_all_reduces": len(torch_sizes), "course_all_reduces": len(course_sizes)})
        optimizer.step()
    return rows
