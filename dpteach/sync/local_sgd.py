"""``local_sgd``: every rank steps on its own gradients, and the ranks average their *weights* every H steps.

Synchronous data parallelism averages gradients at every step, so a step costs one all-reduce of the
whole model. Local SGD (Stich, "Local SGD Converges Fast and Communicates Little", ICLR 2019; Lin et al.,
"Don't Use Large Mini-Batches, Use Local SGD", ICLR 2020) lets each rank take H optimizer steps on its
own shard of the data, then replaces every replica by their average::

    step:       0    1    2  ...  H-1 | H  ...  2H-1 | ...
    rank r:     local steps on its own gradients      (no message)
    at H-1:     theta <- mean over ranks of theta_r   (one all-reduce of the weights)

One all-reduce every H steps: the bytes per step fall by H, and on a link that is slow or far away
the time per step falls with them. The price is in the loss: between two averages the replicas drift
apart, each following its own gradients, so a step of local SGD does less for the global loss than a
step of synchronous SGD. Which effect wins, on which link, is what lesson 14 measures.

**H = 1 is synchronous data parallelism.** With plain SGD, averaging the weights after one step is
``mean(theta - lr g_r) = theta - lr mean(g_r)``: the synchronous step. That stays true with momentum,
because the momentum buffer is a linear function of the gradients: each rank's buffer is
``m_r = mu m_r' + g_r``, so their mean is the buffer synchronous SGD would hold, although no rank holds
it. (With Adam it does not hold: its step divides by a root of squared gradients, which is not linear.)
``tests/test_sending_less.py`` checks H = 1 against the single-process reference.

The optimizer state (momentum, Adam's moments) stays local and is never averaged, as in the papers;
only the weights travel. ``diloco.py`` adds an outer optimizer on top of this loop.
"""
from __future__ import annotations

import torch
from torch.nn.utils import parameters_to_vector

from .base import GradientSync
from .knobs import Knob


def copy_into_parameters(flat: torch.Tensor, params) -> None:
    """Copy the flat vector ``flat`` into ``params``, in order. (torch's ``vector_to_parameters`` would make each
    parameter a *view* of ``flat``: a later in-place step would then write into ``flat`` too.)"""
    offset = 0
    for p in params:
        p.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()


class LocalSGD(GradientSync):
    name = "local_sgd"
    label = "local SGD (average weights every H steps)"
    colour = "#55A868"
    exact = False
    knobs = (Knob("sync_every", 8, "local steps between two averages of the weights (H)", low=1),)
    main_knob = "sync_every"

    @classmethod
    def cycle(cls, config: dict) -> int:
        return cls.settings(config.get("knobs"))["sync_every"]

    def __init__(self, model, timeline, sync_every: int, **options):
        options.pop("bucket_mb", None), options.pop("first_bucket_mb", None)  # it sends weights, not buckets
        super().__init__(model, timeline, **options)
        self.sync_every = sync_every

    def finish(self, step: int) -> None:
        pass  # no gradient leaves the rank: each steps on its own

    def synchronises_after(self, step: int) -> bool:
        """Whether the weights are averaged after optimizer step ``step`` (counted from 0)."""
        return (step + 1) % self.sync_every == 0

    def step_optimizer(self, optimizer) -> None:
        super().step_optimizer(optimizer)  # the local step, on this rank's own gradients
        if self.synchronises_after(self.step):
            self.synchronise(self.step)

    def synchronise(self, step: int) -> None:
        """Every replica becomes the average of all of them: one all-reduce of every weight, flattened."""
        with torch.no_grad():
            with self.overhead(step, "pack"):
                flat = parameters_to_vector(self.params)
            with self.comm.exchange(name="average"):
                self.all_reduce_mean(flat)
            with self.overhead(step, "unpack"):
                copy_into_parameters(flat, self.params)
