"""Exercise 08 (stretch): ZeRO stage 1 - each rank keeps the optimizer state of its own slice only.

The learner writes ``ZeroSGD(params, lr, momentum)`` with ``step()`` and ``state_numel()``. Checked on
real ranks: after several steps the weights equal plain SGD with momentum on the gradient averaged
over ranks (computed independently on every rank), every rank ends with identical weights, and the
momentum state held per rank is at most one slice of ``chunk_bounds(N, W)``. The exercise is the
reduce-scatter / update / all-gather pattern, so an all-reduce of the gradients scores zero.

**The state is measured, not taken on the learner's word.** ``state_numel()`` is what the learner says;
the grader also walks what the optimizer can hold between steps - its attributes, its class's, and the
globals of the solution cell (through lists, tuples, sets and dicts) - and adds up the tensors' storages
that are not the model's own weights (``held_elements``). Both must be at most one slice - the measured
one in every check: a ZeRO-1 that keeps the whole state is not one, however right its weights.

The numbers have to travel as messages. Each rank's batches are drawn from its own secret salt, which the
others learn only after the last step (``common.py``), and each rank counts the bytes that reached it
through the process group (``guard.Traffic``): a reduce-scatter and an all-gather bring a rank at least
the N elements of the flat vector per step - its slice of every other rank's gradient, and every other
slice of the updated weights - so gradients or weights passed through files or the store do not count.
The optimizer lives in the rank: the rank drives it (``ctx.drive``) and the judging runs on what it left.
"""
from __future__ import annotations

import math
from functools import partial

import torch
from torch import nn

from ..spec import PROCESS_GROUP_ALL_REDUCES, TORCH_ALL_REDUCES, Check, Exercise, Fail, observes
from .common import everyones, reachable_bytes, require_received, secret_seed

STUB = '''\
import torch
import torch.distributed as dist
from dpteach.collectives import chunk_bounds, ring_all_gather, ring_reduce_scatter


class ZeroSGD:
    """SGD with momentum whose optimizer state is sharded over the ranks (ZeRO stage 1).

    params: the model's parameters, identical on every rank. Think of them as one flat vector of N
    elements (in params order); rank r owns the slice chunk_bounds(N, W)[r] and keeps momentum
    for that slice only.
    """

    def __init__(self, params, lr, momentum):
        raise NotImplementedError("your code here")

    def step(self):
        """Each parameter's .grad holds this rank's own gradient. Average the gradients over the ranks
        - but you need only your slice of the average: a reduce-scatter. Update your slice
        (buf = momentum * buf + grad; p = p - lr * buf), then all-gather the slices so that every
        rank ends with the same, complete parameters."""
        raise NotImplementedError("your code here")

    def state_numel(self):
        """How many elements of optimizer state (momentum) this rank holds."""
        raise NotImplementedError("your code here")
'''

LR, MOMENTUM = 0.1, 0.9


def zero_model(widths, seed):
    torch.manual_seed(seed)
    layers = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1]).double()


def zero_batch(widths, seed, step, rank):
    generator = torch.Generator().manual_seed((seed * 1000 + step * 41 + rank) % 2 ** 63)
    return (torch.randn(4, widths[0], generator=generator, dtype=torch.float64),
            torch.randn(4, widths[-1], generator=generator, dtype=torch.float64))


def zero_trajectory(widths, seed, seeds, steps):
    """Every rank's gradient, averaged, through SGD with momentum as torch.optim.SGD defines it (written
    out, because constructing a torch optimizer first imports torch._dynamo: seconds of CPU per rank).
    ``seeds[step][rank]``: the seed of each rank's batch at each step. Returns, per step, every rank's flat
    gradient and the flat momentum after the update; and the final weights. (Exercise 09 checks the first
    two slice by slice; both exercises check the weights.)"""
    world = len(seeds[0])
    model = zero_model(widths, seed)
    params = list(model.parameters())
    buffer = torch.zeros(sum(p.numel() for p in params), dtype=torch.float64)
    grads, buffers = [], []
    for step in range(steps):
        per_rank = []
        for rank in range(world):
            model.zero_grad()
            x, y = zero_batch(widths, seeds[step][rank], step, rank)
            nn.functional.mse_loss(model(x), y).backward()
            per_rank.append(torch.cat([p.grad.reshape(-1) for p in params]))
        buffer = MOMENTUM * buffer + sum(per_rank) / world
        grads.append(per_rank)
        buffers.append(buffer)
        with torch.no_grad():
            for p, piece in zip(params, buffer.split([p.numel() for p in params])):
                p.sub_(LR * piece.view_as(p))
    return grads, buffers, [p.detach() for p in params]


def zero_case(ctx, props, widths, steps, seed):
    mine_seed = secret_seed(ctx, seed)
    seen = ctx.drive(_zero_steps, widths, steps, seed, mine_seed, "state" in props)
    seeds = everyones(ctx, mine_seed)  # only now: see common.py
    total = sum(p.numel() for p in zero_model(widths, seed).parameters())
    if ctx.world > 1:
        require_received(ctx, seen["received"], steps * total * 8, "a reduce-scatter and an all-gather each step")
    slice_ = math.ceil(total / ctx.world)
    if seen["measured"] > slice_ + 8:  # in every check: a ZeRO-1 that keeps everything is not one
        raise Fail(f"between steps, this rank's optimizer (with the solution's globals) holds "
                   f"{seen['measured']} elements in tensors of its own, more than its slice ({slice_}): "
                   f"each rank keeps momentum for chunk_bounds(N, W)[rank] only, and no full-length buffer")
    if "state" in props and (not isinstance(seen["state"], int) or seen["state"] > slice_):
        raise Fail("this rank holds more momentum than its slice: each rank keeps state for "
                   "chunk_bounds(N, W)[rank] only")
    if "weights" in props:
        for mine, expected in zip(seen["params"], zero_trajectory(widths, seed, [seeds] * steps, steps)[2]):
            if not torch.allclose(mine, expected, atol=1e-10, rtol=1e-9):
                raise Fail("the weights differ from SGD with momentum on the gradient averaged over ranks: "
                           "check the division by W, the momentum update, and that every slice is gathered")


@observes
def held_elements(optimizer, params, namespace) -> int:
    """Elements (float64) in tensors reachable from the optimizer, its class and the solution cell's globals
    (through lists, tuples, sets and dicts, a few levels deep), once per storage, leaving out storage shared
    with a parameter (the model's own weights)."""
    roots = list(getattr(optimizer, "__dict__", {}).values()) + list(vars(type(optimizer)).values())
    roots += [value for value in namespace.values() if isinstance(value, (torch.Tensor, dict, list, tuple, set))]
    return reachable_bytes(roots, params) // 8


@observes
def _zero_steps(ctx, widths, steps, seed, mine_seed, state):
    """The learner's ZeroSGD through ``steps`` steps; what it left: the weights, its state, the bytes received."""
    model = zero_model(widths, seed)
    params = list(model.parameters())
    before = ctx.received_bytes()
    with ctx.running_learner_code():
        optimizer = ctx.learner("ZeroSGD")(params, LR, MOMENTUM)
    for step in range(steps):
        for p in params:
            p.grad = None
        x, y = zero_batch(widths, mine_seed, step, ctx.rank)
        nn.functional.mse_loss(model(x), y).backward()
        with ctx.running_learner_code():
            optimizer.step()
    after = ctx.received_bytes()
    held = None
    if state:
        with ctx.running_learner_code():
            held = optimizer.state_numel()
    return {"params": [p.detach().clone() for p in params], "state": held,
            "measured": held_elements(optimizer, params, ctx.namespace),
            "received": None if after is None or before is None else after - before}


HINT = ("Flatten the gradients in params order, reduce-scatter them (your slice = the sum over ranks), "
        "divide by W, update your slice of the flat parameters with your momentum slice, all-gather, and copy "
        "back into each parameter.")

CHECKS = (
    Check("W=2: three steps equal SGD with momentum on the averaged gradient", 3, 2,
          partial(zero_case, props=("weights",), widths=(4, 6, 3), steps=3, seed=91)),
    Check("W=2: each rank keeps momentum for its slice only", 1, 2,
          partial(zero_case, props=("state",), widths=(4, 6, 3), steps=1, seed=92)),
    Check("W=3: N not divisible by W", 2, 3,
          partial(zero_case, props=("weights", "state"), widths=(3, 5, 2), steps=2, seed=93)),
    Check("larger world, deeper model, four steps", 2, 4,
          partial(zero_case, props=("weights", "state"), widths=(5, 7, 4, 3), steps=4, seed=94), hidden=True),
)


EXERCISE = Exercise(
    id="08", stem="08_zero1", title="ZeRO stage 1: sharded optimizer state (stretch)", names=("ZeroSGD",),
    stub=STUB, checks=CHECKS, hint=HINT,
    forbidden=TORCH_ALL_REDUCES + ("dpteach.collectives.ring_all_reduce", "dpteach.collectives.tree_all_reduce",
                                   "dpteach.collectives.naive_all_reduce"),
    forbidden_methods=PROCESS_GROUP_ALL_REDUCES,
    rule="this exercise asks for reduce-scatter / update / all-gather, and your code all-reduces instead",
)
