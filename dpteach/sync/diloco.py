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

At H = 1 the paper's outer step diverges on the course's MLP: the pseudo-gradient is then one inner step,
and Nesterov momentum on top of the inner momentum stacks two slow memories of the gradient in series
(``stability_at_one_step`` below works out by how much, from this file's update rule); lesson 14 shows it.

Every rank keeps its own inner optimizer state (never averaged) and the same outer state (it applies
the same all-reduced ``delta``, so the outer step is identical everywhere). The outer state is a copy
of the weights plus a momentum buffer: two more model-sized tensors per rank.
"""
from __future__ import annotations

import numpy as np
import torch
from torch.nn.utils import parameters_to_vector

from .. import validate

from .knobs import Knob
from .local_sgd import LocalSGD, copy_into_parameters


class DiLoCo(LocalSGD):
    name = "diloco"
    label = "DiLoCo (outer Nesterov every H steps)"
    colour = "#937860"
    knobs = LocalSGD.knobs + (
        Knob("outer_lr", 0.7, "the outer optimizer's learning rate (the paper's 0.7)", kind=float, above=0),
        Knob("outer_momentum", 0.9, "the outer optimizer's Nesterov momentum (0: plain SGD)", kind=float, low=0,
             high=0.999))

    def __init__(self, model, timeline, outer_lr: float, outer_momentum: float, **options):
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


def stability_at_one_step(outer_lr: float, outer_momentum: float, inner_momentum: float) -> dict:
    """DiLoCo averaging after every step (H = 1) on a quadratic ``f = c x^2 / 2``, read from ``synchronise`` above.

    With H = 1 each round is one inner step, so the pseudo-gradient is that step: ``delta = lr m``, ``m`` the
    inner momentum buffer (``m <- mu_in m + grad``). The outer step is torch's SGD with Nesterov momentum:
    ``b <- mu_out b + delta``, ``theta <- theta - lr_out (delta + mu_out b)``. Against a steady gradient ``b``
    settles at ``delta / (1 - mu_out)``, so the weights move ``lr_out / (1 - mu_out)`` times as far per step as
    synchronous SGD with the same inner optimizer (``steady_gain``). Worse, two momentum buffers now sit in series,
    each remembering a gradient for about ``1 / (1 - mu)`` steps: the push keeps going long after the gradient
    turned, and on a curved loss the weights overshoot further every swing. The state (theta, lr m, b) goes
    linearly from step to step; the run is stable while every eigenvalue of that map is inside the unit circle.
    ``largest_stable``: the largest ``lr x c`` for which it is (bisected); ``synchronous_limit``: the same for
    synchronous SGD with momentum ``mu_in``, ``2 (1 + mu_in)`` (heavy ball's bound, Polyak 1964).
    """
    validate.number("outer_lr", outer_lr, above=0)
    validate.number("outer_momentum", outer_momentum, low=0, high=0.999)
    validate.number("inner_momentum", inner_momentum, low=0, high=0.999)

    def stable(a: float) -> bool:  # a = lr x curvature; state (theta, lr m, b)
        mi, mo, eta = inner_momentum, outer_momentum, outer_lr
        m_next = np.array([a, mi, 0.0])  # lr m' = mi (lr m) + a theta
        b_next = np.array([0.0, 0.0, mo]) + m_next  # b' = mo b + delta, delta = lr m'
        if mo > 0:  # Nesterov: theta' = theta - eta (delta + mo b')
            theta_next = np.array([1.0, 0.0, 0.0]) - eta * (m_next + mo * b_next)
        else:  # plain SGD: theta' = theta - eta delta
            theta_next = np.array([1.0, 0.0, 0.0]) - eta * m_next
        return max(abs(np.linalg.eigvals(np.array([theta_next, m_next, b_next])))) < 1.0

    grid = np.geomspace(1e-6, 10.0, 400)
    first_bad = next((a for a in grid if not stable(a)), None)
    low, high = (grid[0], first_bad) if first_bad is not None else (grid[-1], grid[-1])
    for _ in range(60 if first_bad is not None else 0):
        mid = (low + high) / 2
        low, high = (mid, high) if stable(mid) else (low, mid)
    return {"outer_lr": outer_lr, "outer_momentum": outer_momentum, "inner_momentum": inner_momentum,
            "steady_gain": outer_lr / (1 - outer_momentum), "largest_stable": float(low),
            "synchronous_limit": 2 * (1 + inner_momentum)}
