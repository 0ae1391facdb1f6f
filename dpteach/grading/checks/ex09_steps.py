"""Exercise 09's steps: the learner's Zero2SGD driven through real steps, and what each step is judged on
(``ex09_zero2.py`` holds the exercise's text and its list of checks).

Each step the rank drives the optimizer twice - ``_reduce``: backward on this rank's batch, then
``reduce_gradients()``; ``_step``: ``step()`` - and records what each left: which ``.grad`` is gone, the
bytes the optimizer holds, the elements sent, the slices it keeps (with their storage: a view into a
full-length buffer is still that buffer), the weights. The judging runs on that record, in the rank and
again in the replay outside it (``grading/replay.py``). Each step's batches are drawn from every rank's own secret
salt, which the others learn only once that step's ``reduce_gradients()`` has returned (``common.py``): it
cannot know the average it has to produce without the messages that carry it.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ...collectives import chunk_bounds
from ..spec import Fail, observes
from .common import everyones, reachable_bytes, secret_seed
from .ex08_zero1 import LR, MOMENTUM, zero_batch, zero_model, zero_trajectory

ELEMENT = 8  # bytes per element: the models are float64


def _close(a, b):
    return a.shape == b.shape and torch.allclose(a, b, atol=1e-10, rtol=1e-9)


def _check_slice(kept, what, expected, ctx, total, later, own=None):
    """``kept`` must be this rank's slice of ``expected`` (a flat full-length tensor), in its own storage."""
    bounds = chunk_bounds(total, ctx.world)
    start, stop = bounds[ctx.rank]
    if not isinstance(kept, torch.Tensor):
        raise Fail(f"{what} should return the torch.Tensor you keep, but it returned {type(kept).__name__}{later}")
    if kept.numel() != stop - start:
        raise Fail(f"{what} holds {kept.numel()} elements, but this rank's slice chunk_bounds(N, W)[rank] has "
                   f"{stop - start}: keep exactly your slice of the flat vector{later}")
    if kept.untyped_storage().nbytes() > math.ceil(total / ctx.world) * kept.element_size():
        raise Fail(f"{what} is a view into a larger buffer, which stays in memory whole: keep your slice in a "
                   f"tensor of its own (.clone() it) and let the full-length one go{later}")
    flat = kept.detach().reshape(-1).to(torch.float64)
    if _close(flat, expected[start:stop]):
        return
    if own is not None and ctx.world > 1 and _close(flat, ctx.world * expected[start:stop]):
        raise Fail(f"{what} holds the sum of the ranks' gradients, not their average: divide by W{later}")
    if own is not None and ctx.world > 1 and _close(flat, own[start:stop]):
        raise Fail(f"{what} holds this rank's own gradient, not the average over ranks: reduce-scatter the "
                   f"flat gradients first{later}")
    for other, (a, b) in enumerate(bounds):
        if other != ctx.rank and b - a == stop - start and _close(flat, expected[a:b]):
            raise Fail(f"{what} holds slice {other} of the flat vector, not slice {ctx.rank}: rank r keeps "
                       f"chunk_bounds(N, W)[r]{later}")
    which = "the gradient averaged over ranks" if own is not None else "the momentum of SGD on the averaged gradient"
    raise Fail(f"the values of {what} differ from this rank's slice of {which}{later}")


@observes
def _held_bytes(optimizer, params) -> int:
    """Bytes in tensors reachable from the optimizer's attributes (through lists, tuples, sets and dicts),
    counted once per storage, leaving out storage shared with a parameter (the model's own weights)."""
    return reachable_bytes(getattr(optimizer, "__dict__", {}).values(), params)


def _check_memory(memory, shapes, ctx, total, when, later):
    """``memory``: which parameters have no .grad, and the bytes the optimizer holds (see ``_memory``)."""
    for index, freed in enumerate(memory["freed"]):
        if not freed:
            raise Fail(f"{when}, parameter {index} (shape {tuple(shapes[index])}) still has a .grad: set p.grad = None "
                       f"for every parameter once its gradient is reduced - stage 2 keeps no full gradient{later}")
    slice_elements = math.ceil(total / ctx.world)
    if memory["held"] > 2 * slice_elements * ELEMENT + 64:
        raise Fail(f"{when}, your optimizer holds {memory['held'] // ELEMENT} elements in tensors of its own, more "
                   f"than a gradient slice and a momentum slice ({2 * slice_elements}): a full-length buffer kept "
                   f"between calls is the memory stage 2 removes - build full-length tensors inside a call and let "
                   f"them go{later}")


@observes
def _memory(optimizer, params) -> dict:
    return {"freed": [p.grad is None for p in params], "held": _held_bytes(optimizer, params)}


def zero2_case(ctx, props, widths, steps, seed):
    shapes = [tuple(p.shape) for p in zero_model(widths, seed).parameters()]
    total = sum(math.prod(shape) for shape in shapes)
    live, seeds = {}, []  # live: the learner's optimizer and the model, in the rank only
    ctx.drive(_start, live, widths, seed)
    for step in range(steps):
        later = f" (step {step + 1} of {steps})" if steps > 1 else ""
        mine_seed = secret_seed(ctx, seed * 1000 + step)  # a fresh salt each step
        reduced = ctx.drive(_reduce, live, widths, step, mine_seed, "grad" in props)
        seeds.append(everyones(ctx, mine_seed))  # only now that reduce_gradients() has returned: common.py
        grads, buffers, weights = zero_trajectory(widths, seed, seeds, step + 1)
        if "memory" in props:
            _check_memory(reduced["memory"], shapes, ctx, total, "after reduce_gradients()", later)
        if "grad" in props:
            _check_slice(reduced["grad_slice"], "grad_slice()", sum(grads[step]) / ctx.world, ctx, total, later,
                         own=grads[step][ctx.rank])
        stepped = ctx.drive(_step, live, "state" in props)
        if "traffic" in props and ctx.world > 1:
            _check_traffic(reduced["sent"] + stepped["sent"], ctx.world, total, later)
        if "memory" in props:
            _check_memory(stepped["memory"], shapes, ctx, total, "after step()", later)
        if "state" in props:
            _check_slice(stepped["momentum_slice"], "momentum_slice()", buffers[step], ctx, total, later)
        if "weights" in props and step == steps - 1:
            for mine, expected in zip(stepped["params"], weights):
                if not torch.allclose(mine, expected, atol=1e-10, rtol=1e-9):
                    raise Fail("the weights differ from SGD with momentum on the gradient averaged over ranks: "
                               "check the division by W, the momentum update, and that every updated slice is "
                               "gathered and copied back into the parameters")


@observes
def _start(ctx, live, widths, seed):
    model = zero_model(widths, seed)
    live.update(model=model, params=list(model.parameters()))
    with ctx.running_learner_code():
        live["optimizer"] = ctx.learner("Zero2SGD")(live["params"], LR, MOMENTUM)


@observes
def _reduce(ctx, live, widths, step, mine_seed, grad):
    """Backward on this rank's batch, then the learner's reduce_gradients(); what they left."""
    model, params, optimizer = live["model"], live["params"], live["optimizer"]
    model.zero_grad(set_to_none=True)
    x, y = zero_batch(widths, mine_seed, step, ctx.rank)
    loss = nn.functional.mse_loss(model(x), y)
    live["sent"] = ctx.guard.sent_elements
    with ctx.running_learner_code():
        loss.backward()
        optimizer.reduce_gradients()
    seen = {"memory": _memory(optimizer, params), "sent": ctx.guard.sent_elements - live["sent"]}
    if grad:
        with ctx.running_learner_code():
            seen["grad_slice"] = optimizer.grad_slice()
    return seen


@observes
def _step(ctx, live, state):
    """The learner's step(); what it left: the weights, the optimizer's memory, its momentum slice."""
    params, optimizer = live["params"], live["optimizer"]
    sent = ctx.guard.sent_elements
    with ctx.running_learner_code():
        optimizer.step()
    seen = {"memory": _memory(optimizer, params), "sent": ctx.guard.sent_elements - sent,
            "params": [p.detach().clone() for p in params]}
    if state:
        with ctx.running_learner_code():
            seen["momentum_slice"] = optimizer.momentum_slice()
    return seen


def _check_traffic(sent, world, total, later):
    """A ring reduce-scatter and a ring all-gather: W-1 slices each, plus the sizes their calls exchange."""
    if sent == 0:
        raise Fail("this rank sent nothing point to point: communicate with ring_reduce_scatter and ring_all_gather "
                   "(or your own send/recv) - the grader counts what they send and cannot see inside torch's "
                   "built-in collectives" + later)
    if sent > 2 * (world - 1) * math.ceil(total / world) + 4 * world:
        raise Fail("this rank sent more elements in one step than a reduce-scatter of the gradients plus an "
                   "all-gather of the parameters, (W-1)/W of the vector each: no full-length tensor should "
                   "travel" + later)
