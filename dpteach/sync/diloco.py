"""``diloco``: local SGD with an optimizer on the outside - DiLoCo (Douillard et al., "DiLoCo: Distributed
Low-Communication Training of Language Models", 2023).

Each rank runs H steps of its own *inner* optimizer (the paper uses AdamW) from the same starting
weights ``theta``. Then the ranks all-reduce how far they moved, the *pseudo-gradient*::

    delta = theta - mean over ranks of theta_r        (the average change, pointing "downhill")

and an *outer* optimizer steps the shared weights with it, as if ``delta`` were a gradient: SGD with
Nesterov momentum in the paper (outer learning rate 0.7, momentum 0.9, H = 500 inner steps, 8 workers
communicating 500 times less than synchronous training; the paper also compares other outer optimizers). Every rank then starts its next H inner steps from
the new ``theta``. Momentum carries direction from one round to the next, so a round can move further
than the plain average does.

With outer learning rate 1 and no momentum the outer step is ``theta - delta = mean(theta_r)``: DiLoCo is
then exactly local SGD (``local_sgd.py``); ``tests/test_sending_less.py`` checks it. Bytes: one all-reduce of
the model every H steps, the same as local SGD; what DiLoCo changes is how much each round buys.

Every rank keeps its own inner optimizer state (never averaged) and the same outer state (it applies
the same all-reduced ``delta``, so the outer step is identical everywhere). The outer state is a copy
of the weights plus a momentum buffer: two more model-sized tensors per rank.
"""
from __future__ import annotations

import torch
from torch.nn.utils import parameters_to_vector

from .local_sgd import LocalSGD, copy_into_parameters


class DiLoCo(LocalSGD):
    name = "diloco"
    label = "DiLoCo (outer Nesterov every H steps)"
    colour = "#937860"
    knobs = ("sync_every", "outer_lr", "outer_momentum")

    def __init__(self, model, timeline, outer_lr: float = 0.7, outer_momentum: float = 0.9, **options):
        super().__init__(model, timeline, **options)
        with torch.no_grad():
            # the shared weights theta, where every round starts; the outer optimizer steps these
            self.anchor = parameters_to_vector(self.params).detach().clone()
        self.outer = torch.optim.SGD([self.anchor], lr=outer_lr, momentum=outer_momentum,
                                     nesterov=outer_momentum > 0)

    def held_tensors(self) -> list:
        momentum = [t for t in self.outer.state[self.anchor].values() if torch.is_tensor(t)]
        return super().held_tensors() + [self.anchor] + momentum

    def synchronise(self, step: int) -> None:
        with torch.no_grad():
            with self.overhead(step, "pack"):
                delta = self.anchor - parameters_to_vector(self.params)  # how far this rank moved, reversed
            with self.comm.exchange(name="average"):
                self.all_reduce_mean(delta)  # the pseudo-gradient: the mean over ranks
            with self.overhead(step, "outer step"):
                self.anchor.grad = delta
                self.outer.step()
                self.anchor.grad = None
                copy_into_parameters(self.anchor, self.params)  # every rank starts the next round here
