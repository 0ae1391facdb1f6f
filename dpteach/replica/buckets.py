"""Gradient buckets: many small all-reduces become a few large ones.

Every all-reduce pays a fixed latency (alpha) before a single byte moves, so sending each of a
model's parameters on its own pays it once per tensor. Packing gradients into *buckets* - flat
buffers of a few MB - pays it once per bucket. This module keeps **one simple rule**, after the
one PyTorch DDP started from (Li et al., "PyTorch Distributed", VLDB 2020, and DDP's design note).
DDP today does more (``experiments/ddp_buckets.py`` reads what it does in a real run): it starts
with a single bucket, rebuilds its buckets after the first iteration in the order gradients really
became ready, and caps the first bucket at 1 MiB only when ``bucket_cap_mb`` keeps its default.
The simple rule:

* **Reverse parameter order.** Backward produces gradients roughly from the last layer to the
  first, so buckets are filled in the reverse of ``model.parameters()``: the first bucket is ready
  first and its all-reduce can start while backward is still running (``sync/overlap.py``).
* **A size cap.** Parameters are added one by one and a bucket closes as soon as it holds at
  least ``bucket_mb`` - so the parameter that crosses the cap still joins the bucket, as in DDP's
  ``compute_bucket_assignment_by_size``. (Closing *before* the cap would put each 1 MB weight
  and its tiny bias in separate buckets: twice the messages, twice the latency.)
* **A smaller first bucket**, so that communication starts as early as possible (DDP's rebuilt
  buckets: 1 MiB against 25 MiB, with its default cap). Our models are small, so the default here
  is a quarter of the cap.
* **One dtype and device per bucket**, since a flat buffer has one of each.

Every rank runs this same deterministic function on the same model, so every rank builds the
same buckets in the same order - which matters: collectives are matched by launch order, and two
ranks launching different buckets first would add up the wrong tensors, or hang when their sizes
differ. (DDP, whose rebuilt order comes from each rank's own backward, broadcasts rank 0's
assignment to every rank for the same reason.)
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .. import validate

MB = 1024 * 1024


def check_bucket_sizes(bucket_mb, first_bucket_mb=None) -> None:
    validate.number("bucket_mb", bucket_mb, above=0, unit="a number of MB")
    validate.optional(validate.number, "first_bucket_mb", first_bucket_mb, above=0, unit="a number of MB")


def assign_buckets(params, bucket_mb: float = 1.0, first_bucket_mb: float | None = None) -> list[list[int]]:
    """Group parameter indices into buckets, last parameter first. Returns lists of indices.

    ``params`` is the ordered list of parameters that need gradients (``model.parameters()``);
    index i refers to ``params[i]``.
    """
    check_bucket_sizes(bucket_mb, first_bucket_mb)
    first_cap = (bucket_mb / 4 if first_bucket_mb is None else first_bucket_mb) * MB
    cap = bucket_mb * MB
    buckets: list[list[int]] = []
    current: list[int] = []
    current_bytes = 0
    for index in reversed(range(len(params))):
        p = params[index]
        if current and (p.dtype, p.device) != (params[current[0]].dtype, params[current[0]].device):
            buckets.append(current)  # a flat buffer holds one dtype on one device
            current, current_bytes = [], 0
        current.append(index)
        current_bytes += p.numel() * p.element_size()
        if current_bytes >= (first_cap if not buckets else cap):
            buckets.append(current)
            current, current_bytes = [], 0
    if current:
        buckets.append(current)
    return buckets


@dataclass
class Bucket:
    """One flat buffer holding the gradients of some parameters, with a view per parameter."""

    index: int
    params: list
    buffer: torch.Tensor
    views: list = field(default_factory=list)

    @classmethod
    def build(cls, index: int, params: list) -> "Bucket":
        total = sum(p.numel() for p in params)
        buffer = torch.zeros(total, dtype=params[0].dtype, device=params[0].device)
        views, offset = [], 0
        for p in params:
            views.append(buffer[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        return cls(index, params, buffer, views)

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def copy_in(self, position: int | None = None) -> None:
        """Copy gradients into the flat buffer (one parameter, or all of them)."""
        positions = range(len(self.params)) if position is None else [position]
        for i in positions:
            grad = self.params[i].grad
            if grad is None:
                self.views[i].zero_()
            else:
                self.views[i].copy_(grad)

    def copy_out(self) -> None:
        """Write the (reduced) flat buffer back into each parameter's ``.grad``."""
        for p, view in zip(self.params, self.views):
            if p.grad is None:
                p.grad = view.clone()
            else:
                p.grad.copy_(view)


def build_buckets(model: torch.nn.Module, bucket_mb: float = 1.0,
                  first_bucket_mb: float | None = None) -> list[Bucket]:
    """Buckets for every parameter of ``model`` that needs a gradient, in launch order."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [Bucket.build(i, [params[j] for j in indices])
            for i, indices in enumerate(assign_buckets(params, bucket_mb, first_bucket_mb))]
