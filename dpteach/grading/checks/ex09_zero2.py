"""Exercise 09 (stretch): ZeRO stage 2 - the gradients are sharded as well as the optimizer state.

The learner writes ``Zero2SGD(params, lr, momentum)``: after backward, ``reduce_gradients()`` keeps this
rank's slice of the averaged flat gradient and frees every ``.grad``; ``step()`` updates the slice with
momentum and all-gathers the slices. This is P_os+g of Rajbhandari et al., "ZeRO: Memory Optimizations
Toward Training Trillion Parameter Models" (SC 2020): section 5.1's sharded optimizer state plus 5.2's
gradient partitioning - a rank that updates only its slice needs no other slice of the gradient either.

Checked on real ranks, from the tensors wherever possible: the weights after several steps equal SGD
with momentum on the rank-averaged gradient (float64, computed independently on every rank); after
``reduce_gradients()`` no parameter has a ``.grad``; the tensors reachable from the optimizer's
attributes (and the lists, tuples and dicts in them) that share no storage with a parameter add up to
two slices at most; ``grad_slice()`` and ``momentum_slice()`` are exactly this rank's slice of
``chunk_bounds(N, W)``, with the right values, in storage no larger than a slice (a view into a
full-length buffer keeps that buffer alive); and the elements sent per step - the guard counts
point-to-point sends, which ``ring_reduce_scatter`` and ``ring_all_gather`` use - are at most one
reduce-scatter plus one all-gather.

What cannot be verified: tensors kept elsewhere (globals, closures, objects inside other objects); the
peak during backward, when every full gradient exists for a moment (real stage 2 reduce-scatters bucket
by bucket during backward, as ``dpteach/sync/zero2.py`` does); traffic inside torch's built-in
collectives, which the counter cannot see - so the exercise asks for the course's point-to-point ones,
and a rank that sends nothing fails the traffic check. All-reduce is forbidden, as in exercise 08.

The optimizer lives in the rank: each step the rank drives it twice (``_reduce``: backward and
``reduce_gradients()``; ``_step``: ``step()``) and records what it left; the judging runs on that record,
in the rank and again in the replay outside it. Each step's batches are drawn from every rank's own
secret salt, learned by the others only once that step's ``reduce_gradients()`` has returned (``common.py``).
"""
from __future__ import annotations

from functools import partial

from ..spec import Check, Exercise
from .ex08_zero1 import EXERCISE as ZERO1
from .ex09_steps import zero2_case

STUB = '''\
import torch
import torch.distributed as dist
from dpteach.collectives import chunk_bounds, ring_all_gather, ring_reduce_scatter


class Zero2SGD:
    """SGD with momentum whose gradients and momentum are sharded over the ranks (ZeRO stage 2).

    params: the model's parameters, identical on every rank. Think of them as one flat vector of N
    elements (in params order); rank r owns the slice chunk_bounds(N, W)[r]. Between calls, keep only
    your gradient slice and your momentum slice - no full-length tensor of your own.

    What the grader does at every step, on every rank:
        sets every p.grad to None; forward; loss.backward()   # each p.grad: this rank's own gradient
        optimizer.reduce_gradients()                          # then: every p.grad must be None
        optimizer.grad_slice()                                # read, to check your slice
        optimizer.step()
        optimizer.momentum_slice()                            # read, to check your momentum
    """

    def __init__(self, params, lr, momentum):
        raise NotImplementedError("your code here")

    def reduce_gradients(self):
        """Average the gradients over the ranks, keeping only your slice of the average: flatten them in
        params order, reduce-scatter, divide by W. Then free the full gradients: set every p.grad to None."""
        raise NotImplementedError("your code here")

    def step(self):
        """Update your slice of the parameters with the gradient slice you kept (buf = momentum * buf + grad;
        p = p - lr * buf), all-gather the updated slices and copy them back into the parameters, so that
        every rank holds the same, complete parameters."""
        raise NotImplementedError("your code here")

    def grad_slice(self):
        """The tensor in which you keep your slice of the averaged gradient (1-D, chunk_bounds(N, W)[rank])."""
        raise NotImplementedError("your code here")

    def momentum_slice(self):
        """The tensor in which you keep your slice of the momentum (1-D, same slice)."""
        raise NotImplementedError("your code here")
'''

HINT = ("reduce_gradients: flatten the .grad tensors in params order, ring_reduce_scatter them, divide by W, keep "
        "that slice, set every p.grad = None. step: buf = momentum * buf + grad on your slice, subtract lr * buf "
        "from your slice of the flat parameters, ring_all_gather, copy back into each parameter.")
ALL = ("memory", "grad", "state", "weights", "traffic")

CHECKS = (
    Check("W=2: after reduce_gradients no .grad is left, and the optimizer holds two slices at most", 2, 2,
          partial(zero2_case, props=("memory",), widths=(4, 6, 3), steps=2, seed=101)),
    Check("W=2: grad_slice() is this rank's slice of the averaged gradient, in a tensor of its own", 2, 2,
          partial(zero2_case, props=("grad",), widths=(4, 6, 3), steps=1, seed=102)),
    Check("W=2: momentum_slice() is this rank's slice of the momentum, in a tensor of its own", 1, 2,
          partial(zero2_case, props=("state",), widths=(4, 6, 3), steps=2, seed=103)),
    Check("W=2: three steps equal SGD with momentum on the averaged gradient", 3, 2,
          partial(zero2_case, props=("weights",), widths=(4, 6, 3), steps=3, seed=104)),
    Check("W=3: N not divisible by W", 2, 3,
          partial(zero2_case, props=("memory", "grad", "state", "weights"), widths=(3, 5, 2), steps=2, seed=105)),
    Check("W=3: one reduce-scatter and one all-gather per step, no more traffic", 1, 3,
          partial(zero2_case, props=("traffic",), widths=(3, 5, 2), steps=2, seed=106)),
    Check("larger world, deeper model, four steps", 2, 4,
          partial(zero2_case, props=ALL, widths=(5, 7, 4, 3), steps=4, seed=107), hidden=True),
    Check("a world of one rank", 1, 1,
          partial(zero2_case, props=ALL, widths=(3, 4, 2), steps=2, seed=108), hidden=True),
)


EXERCISE = Exercise(
    id="09", stem="09_zero2", title="ZeRO stage 2: sharded gradients and optimizer state (stretch)",
    names=("Zero2SGD",), stub=STUB, checks=CHECKS, hint=HINT,
    forbidden=ZERO1.forbidden, forbidden_methods=ZERO1.forbidden_methods,
    rule="this exercise asks for reduce-scatter / update / all-gather, and your code all-reduces instead",
)
