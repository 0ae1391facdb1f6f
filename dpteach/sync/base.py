"""What every gradient-sync strategy answers: when, and how, do the ranks' gradients become their average?

The trainer drives every strategy through the same three calls, in this order, every step::

    for k in range(K):                                  # K micro-batches (gradient accumulation)
        with strategy.micro_batch(sync=(k == K - 1)):   # decided BEFORE forward
            loss = loss_fn(model(x_k), y_k) / K
            loss.backward()
    strategy.finish(step)                               # afterwards: every .grad is the average
    optimizer.step()

Why is ``sync`` decided before forward? PyTorch DDP arms its reducer during forward (that is
where it learns which parameters will get gradients), and ``no_sync()`` has to wrap forward *and*
backward of the micro-batches that must not communicate. Deciding after forward is too late:
the hooks are already armed. Strategies that communicate from autograd hooks (``overlap``) read
the same flag when the hooks fire.

Gradients are averaged, not summed: each rank's loss is a mean over its own batch, so the mean of
the W ranks' gradients is the gradient of the mean over the global batch - the single-process
gradient. (gloo has no AVG reduction, so strategies sum and divide by W.)

Every strategy sends through ``self.comm`` (``dpteach/link.py``): straight to ``torch.distributed``,
or, when the run chose a ``link``, through an emulated network that holds each collective back
until that link would have delivered it.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist

from ..costmodel import busbw_factor
from ..link import Comm


class GradientSync:
    """Base class: holds the model, the timeline, and the byte count; subclasses fill in ``finish``."""

    name = "base"
    exact = True  # expected to equal single-process training up to float32 rounding

    def __init__(self, model: torch.nn.Module, timeline, link=None, **options):
        self.model = model
        self.timeline = timeline
        self.options = options
        self.world = dist.get_world_size()
        self.comm = Comm(link, self.world)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.will_sync = True
        self.wire_bytes = 0  # bytes this rank sent in the current step

    def wrap(self) -> torch.nn.Module:
        """The module the trainer calls for forward (DDP returns its wrapper)."""
        return self.model

    @contextmanager
    def micro_batch(self, sync: bool):
        """Run one micro-batch's forward and backward; ``sync`` says whether it is the last one."""
        self.will_sync = sync
        yield

    def start_step(self, step: int) -> None:
        self.step = step
        self.wire_bytes = 0

    def finish(self, step: int) -> None:
        raise NotImplementedError

    # -- helpers the strategies share --------------------------------------------------------
    def count_all_reduce(self, tensor: torch.Tensor) -> None:
        """A ring all-reduce puts 2(W-1)/W of the message on each rank's wire (nccl-tests' busbw)."""
        self.wire_bytes += int(tensor.numel() * tensor.element_size() * busbw_factor(self.world))

    def all_reduce_mean(self, tensor: torch.Tensor, async_op: bool = False):
        """Divide by W, then sum across ranks: the mean, with no AVG op needed (DDP does the same)."""
        tensor.div_(self.world)
        self.count_all_reduce(tensor)
        return self.comm.all_reduce(tensor, async_op=async_op)
