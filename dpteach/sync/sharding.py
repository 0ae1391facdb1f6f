"""What the ZeRO stages share: flat shards, and the two halves of an all-reduce.

Lesson 02 built an all-reduce as a reduce-scatter followed by an all-gather. Sharded data
parallelism takes the two halves apart and keeps something between them: after the reduce-scatter
rank r holds only shard r of the averaged gradient, so it only needs the optimizer state of shard r
(ZeRO stage 1), only keeps gradient shard r (stage 2), and may even keep only parameter shard r
between uses (stage 3). The all-gather then hands every rank the updated parameters. Rajbhandari et
al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models" (SC 2020), sections 5-7.

The layout, for a group of parameters (a bucket in stages 1-2, a layer in stage 3)::

    flat  = [ p0 | p1 | p2 | padding ]        one buffer, length a multiple of W; each p is a view into it
    shard r = flat[r*n/W : (r+1)*n/W]         what rank r owns, updates and keeps

Padding makes every shard the same length, as torch's reduce-scatter and all-gather need (FSDP2 pads
the same way). Each shard is a ``torch.nn.Parameter`` *sharing storage* with the flat buffer: the
optimizer steps it in place and the model's own parameters see the new values at once.
"""
from __future__ import annotations

import torch

from ..replica.buckets import assign_buckets
from .base import GradientSync


class FlatGroup:
    """Some parameters moved into one padded flat buffer; ``shard`` is this rank's piece of it."""

    def __init__(self, params: list, world: int, rank: int):
        self.params = params
        self.numel = numel = sum(p.numel() for p in params)  # the parameters' own length, without the padding
        self.shard_numel = -(-numel // world)  # ceil: every shard the same length
        first = params[0]
        self.flat = torch.zeros(self.shard_numel * world, dtype=first.dtype, device=first.device)
        self.offsets, offset = [], 0
        for p in params:
            self.flat[offset:offset + p.numel()].copy_(p.detach().reshape(-1))
            p.data = self.flat[offset:offset + p.numel()].view_as(p)  # the model now reads the flat buffer
            self.offsets.append(offset)
            offset += p.numel()
        start = rank * self.shard_numel
        self.shard = torch.nn.Parameter(self.flat[start:start + self.shard_numel])  # shares the storage
        self.grad_shard = torch.zeros_like(self.shard)

    @property
    def nbytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()

    def flat_gradient(self) -> torch.Tensor:
        """The group's gradients in one padded buffer (a new tensor; zeros where a parameter has none)."""
        out = torch.zeros_like(self.flat)
        for p, offset in zip(self.params, self.offsets):
            if p.grad is not None:
                out[offset:offset + p.numel()].copy_(p.grad.reshape(-1))
        return out


def shard_buckets(model, world: int, rank: int, bucket_mb: float, first_bucket_mb=None) -> list[FlatGroup]:
    """The model's parameters in buckets (reverse order, as DDP and ``dpteach/replica/buckets.py`` cut them), each flat."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [FlatGroup([params[i] for i in indices], world, rank)
            for indices in assign_buckets(params, bucket_mb, first_bucket_mb)]


# Modules whose forward reads their children's parameters without calling the children: torch's
# MultiheadAttention hands ``out_proj.weight`` and ``out_proj.bias`` straight to
# ``F.multi_head_attention_forward``, so ``out_proj``'s own forward (and any hook on it) never runs.
READS_CHILDREN = (torch.nn.MultiheadAttention,)


def parameter_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules that zero3 gathers and FSDP2 shards one at a time, in definition order: every module
    that holds parameters of its own, except that a module of :data:`READS_CHILDREN` takes its
    children's parameters into its own unit (their forward never runs, so they could not be gathered
    on time: a zero3 rank would compute with an empty ``out_proj``)."""
    inside = {id(m) for unit in model.modules() if isinstance(unit, READS_CHILDREN)
              for m in unit.modules() if m is not unit}
    return [m for m in model.modules() if id(m) not in inside
            and any(p.requires_grad for p in (m.parameters() if isinstance(m, READS_CHILDREN)
                                               else m.parameters(recurse=False)))]


def unit_parameters(unit: torch.nn.Module) -> list:
    """The trainable parameters of one unit of :func:`parameter_units`."""
    params = unit.parameters() if isinstance(unit, READS_CHILDREN) else unit.parameters(recurse=False)
    return [p for p in params if p.requires_grad]


class ShardedSync(GradientSync):
    """What the ZeRO stages share: ``self.groups`` of flat shards, an optimizer over the shards only,
    and the two halves of the all-reduce - reduce-scatters launched as gradients become ready (stages
    2-3) and waited for after backward, and the all-gather of the updated shards (stages 1-2)."""

    groups: list

    def __init__(self, model, timeline, **options):
        super().__init__(model, timeline, **options)
        self.in_flight = []  # (group, full gradient, work) of the reduce-scatters not yet waited for

    def make_optimizer(self, build):
        return build([group.shard for group in self.groups])  # the optimizer never sees the other shards

    def start_step(self, step: int) -> None:
        super().start_step(step)
        self.in_flight = []

    def launch_reduce_scatter(self, group) -> None:
        """Average the group's gradients into ``group.grad_shard``, without waiting; drop the full ones."""
        full = group.flat_gradient()
        for p in group.params:
            p.grad = None  # the full gradients go; only shard r of their average stays
        self.hold(full.numel() * full.element_size())
        full.div_(self.world)
        work = self.comm.reduce_scatter(group.grad_shard, full, async_op=True)
        self.comm.launched(work, "reduce_scatter")
        self.in_flight.append((group, full, work))

    def wait_reduce_scatters(self, step: int) -> None:
        with self.comm.waiting():
            for group, full, work in self.in_flight:
                self.comm.wait(work)
                self.release(full.numel() * full.element_size())
                group.shard.grad = group.grad_shard
        self.in_flight = []

    def gather_updated(self) -> None:
        """After the step: every rank's updated shard to every rank, into the flat buffers the model reads."""
        for index, group in enumerate(self.groups):
            mine = group.shard.detach().clone()  # the all-gather writes into the buffer it would read from
            self.hold(mine.numel() * mine.element_size())
            with self.comm.exchange("all_gather", bucket=index):
                self.comm.all_gather_into_tensor(group.flat, mine)
            self.release(mine.numel() * mine.element_size())
