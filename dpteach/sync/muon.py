"""``muon``: Muon on data-parallel ranks - each weight matrix owned whole by one rank, ZeRO-1 style.

Muon (Keller Jordan, 2024; torch's ``torch.optim.Muon``) keeps a momentum buffer for each weight matrix (in torch
an exponential average, ``buf.lerp_(grad, 1 - momentum)``) and then replaces the update by the nearest orthogonal
matrix, computed with a few Newton-Schulz iterations of the whole matrix. That "whole" decides the communication.
ZeRO-1 (``zero1.py``) cuts the flat gradient into W equal slices with no regard for where one matrix ends: a rank
would hold pieces of matrices, and an orthogonalisation cannot be done piecewise. So the distributed Muon step
assigns *whole matrices* to ranks (Liu et al., Moonshot AI, "Muon is Scalable for LLM Training", 2025, whose
distributed Muon gathers each matrix's partitions before the step instead)::

    owners:        each parameter to the least loaded rank, largest first (rank r's block holds its own)
    reduce-scatter the gradients, laid out block by block, padded to the largest block
                   -> rank r holds the mean gradient of every matrix it owns, whole
    rank r steps its own matrices with Muon (momentum, Newton-Schulz, update) and the rest with SGD
    all-gather the blocks -> every rank has every updated parameter

The same two halves as an all-reduce (lesson 02), so the bytes are DDP's plus the padding, and each rank holds
the Muon momentum of its own matrices only: the optimizer state is sharded, as in ZeRO-1. The price is balance:
a rank's block is as large as its matrices happen to add up to, and the padding to the largest block is sent
too (each run reports it). The optimizer decides the communication pattern; SGD and Adam would not care where a
slice ends.

It equals ``torch.optim.Muon`` in one process on the same gradients (``experiments/frontier.muon_against_torch``,
held by ``tests/test_frontier.py``), and trains with ``optimizer="muon"`` only, which the single-process reference
then uses too. Over a run it is not "exact" in the course's sense, and neither is ``ddp`` with Muon: torch's
Newton-Schulz iteration runs in bfloat16 (``_zeropower_via_newtonschulz`` in ``torch/optim/_muon.py``), so the
float32 rounding by which a sum in another order differs can tip a bfloat16 rounding and move a weight by
far more than 1e-7; both end within about 1e-3 of one process after 20 steps.
"""
from __future__ import annotations

import torch

from .base import GradientSync


def assign_owners(sizes: list[int], world: int) -> list[int]:
    """The rank that owns each parameter: largest first, each to the rank holding the fewest elements so far
    (ties to the lowest rank), so the blocks come out as even as whole matrices allow."""
    load, owner = [0] * world, [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(world), key=lambda r: (load[r], r))
        owner[i] = rank
        load[rank] += sizes[i]
    return owner


class DistributedMuon(GradientSync):
    name = "muon"
    label = "muon: whole matrices owned, reduce-scatter + all-gather"
    colour = "#CCB974"
    shards = ("optimizer state",)
    exact = False  # torch's Muon orthogonalises in bfloat16: a rounding apart in the mean gradient can move a weight
    #                by a bfloat16 step; on gradients whose mean is exact it equals one process (muon_against_torch)
    emulates_peers = False  # the blocks are real ranks' own

    @classmethod
    def check(cls, config, world_size: int) -> None:
        super().check(config, world_size)
        if config.optimizer != "muon":
            raise ValueError(f"optimizer={config.optimizer!r} is not allowed with strategy='muon': it is Muon's own "
                             f"distributed step; give optimizer='muon' (any other strategy takes it too)")

    def __init__(self, model, timeline, **options):
        options.pop("bucket_mb", None), options.pop("first_bucket_mb", None)  # it sends blocks, not buckets
        super().__init__(model, timeline, **options)
        self.owner = assign_owners([p.numel() for p in self.params], self.world)
        self.place = {}  # parameter index -> offset in its owner's block
        filled = [0] * self.world
        for i, p in enumerate(self.params):
            self.place[i] = filled[self.owner[i]]
            filled[self.owner[i]] += p.numel()
        self.block = max(filled)  # every block padded to the largest: reduce-scatter and all-gather need equal ones
        self.padding = self.block * self.world - sum(filled)
        self.mine = [p for i, p in enumerate(self.params) if self.owner[i] == self.rank]
        self.notes = {"block_elements": self.block, "padding_elements": self.padding,
                      "owned": [i for i in range(len(self.params)) if self.owner[i] == self.rank]}

    def make_optimizer(self, build):
        """Muon (and SGD for the vectors) over this rank's own parameters only: the momentum of the others is
        kept by their owners."""
        return build(self.mine)

    def _in_block(self, block: torch.Tensor, i: int) -> torch.Tensor:
        """Parameter ``i``'s place in its owner's block."""
        return block[self.place[i]:self.place[i] + self.params[i].numel()].view_as(self.params[i])

    def _in_world(self, flat: torch.Tensor, i: int) -> torch.Tensor:
        """Parameter ``i``'s place in the W blocks laid end to end."""
        return self._in_block(flat[self.owner[i] * self.block:(self.owner[i] + 1) * self.block], i)

    def finish(self, step: int) -> None:
        p0 = self.params[0]
        with torch.no_grad():
            with self.overhead(step, "pack"):
                laid_out = torch.zeros(self.block * self.world, dtype=p0.dtype, device=p0.device)
                for i, p in enumerate(self.params):
                    if p.grad is not None:
                        self._in_world(laid_out, i).copy_(p.grad)
                laid_out.div_(self.world)
            mine = torch.empty(self.block, dtype=p0.dtype, device=p0.device)
            with self.comm.exchange("reduce_scatter"):
                self.comm.reduce_scatter(mine, laid_out)
            with self.overhead(step, "unpack"):
                for i, p in enumerate(self.params):
                    p.grad = self._in_block(mine, i).clone() if self.owner[i] == self.rank else None

    def step_optimizer(self, optimizer) -> None:
        super().step_optimizer(optimizer)  # Muon on my own matrices, whole
        p0 = self.params[0]
        with torch.no_grad():
            mine = torch.zeros(self.block, dtype=p0.dtype, device=p0.device)
            for i, p in enumerate(self.params):
                if self.owner[i] == self.rank:
                    self._in_block(mine, i).copy_(p)
            every = torch.empty(self.block * self.world, dtype=p0.dtype, device=p0.device)
            with self.comm.exchange("all_gather"):
                self.comm.all_gather_into_tensor(every, mine)
            for i, p in enumerate(self.params):
                if self.owner[i] != self.rank:
                    p.copy_(self._in_world(every, i))
