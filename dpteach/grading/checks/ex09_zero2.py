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
"""
from __future__ import annotations

import math
from functools import partial

import torch
from torch import nn

from ...collectives import chunk_bounds
from ..spec import Check, Exercise, Fail
from .ex08_zero1 import EXERCISE as ZERO1
from .ex08_zero1 import LR, MOMENTUM, _batch, _model, _trajectory

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

INTRO = """\
# Exercise 09 (stretch) - ZeRO stage 2: shard the gradients too

In exercise 08 each rank kept momentum for its own slice only, yet it still held the *whole* gradient
until the step. It never needs to: after the reduce-scatter, rank r updates slice r and nothing else,
so the rest of the gradient is dead weight. ZeRO stage 2 (Rajbhandari et al., SC 2020: "P_os+g", the
gradient partitioning of section 5.2 on top of stage 1) drops it. In the paper's mixed-precision Adam
accounting, per rank and for Psi parameters: plain data parallelism holds 16 Psi bytes, stage 1 holds
4 Psi + 12 Psi / W, stage 2 holds 2 Psi + 14 Psi / W - and it sends exactly as much as before: a
reduce-scatter of the gradients and an all-gather of the parameters, which together are one all-reduce.

**What to write:** `Zero2SGD(params, lr, momentum)`, with the parameters seen as one flat vector of N
elements cut by `chunk_bounds(N, W)`:

1. `reduce_gradients()`, called right after backward: flatten the gradients, **reduce-scatter**, divide
   by W, keep your slice - and **free the full gradients** (`p.grad = None` for every parameter);
2. `step()`: **update your slice** with your momentum slice (`buf = momentum * buf + grad`,
   `p = p - lr * buf`, as `torch.optim.SGD` with no dampening), then **all-gather** the updated slices and
   copy them into the parameters;
3. `grad_slice()` and `momentum_slice()`: return the tensors you keep, so the grader can look at them.

The stub's docstring lists exactly what the grader calls, and when. Between calls keep only your two
slices: a full-length buffer kept for reuse is precisely the memory stage 2 removes, and a slice that is
a view into a full-length tensor keeps that whole tensor alive (`.clone()` it, or build it on its own).

**Rules:** communicate with `ring_reduce_scatter` / `ring_all_gather` from `dpteach.collectives` (or your
own from exercise 01): the grader counts the elements your rank sends point to point, and it cannot see
inside torch's built-in collectives. No all-reduce (`dist.all_reduce`, `ring_all_reduce`): it scores zero.

**Honest about the peak:** here backward still produces every full `.grad` before you reduce them. The
real stage 2 - and the course's `dpteach/sync/zero2.py` - reduce-scatters each bucket from gradient hooks
*during* backward, so only a bucket's worth of full gradients ever exists. If you want to try that,
register `p.register_post_accumulate_grad_hook` hooks in `__init__` (backward runs under the grader's
watch too) and let `reduce_gradients()` finish what is left; the checks are the same.
"""

TRY = '''\
import dpteach
from dpteach.grading import explain_failures
from torch import nn


def try_it():
    torch.manual_seed(0)
    model = nn.Linear(5, 3)                                 # 18 parameters: 6 per rank
    optimizer = Zero2SGD(list(model.parameters()), lr=0.1, momentum=0.9)
    torch.manual_seed(1 + dist.get_rank())
    for _ in range(3):
        model(torch.randn(4, 5)).pow(2).mean().backward()
        optimizer.reduce_gradients()
        freed = all(p.grad is None for p in model.parameters())
        kept = optimizer.grad_slice().numel()
        optimizer.step()
    return freed, kept, optimizer.momentum_slice().numel(), model.bias.tolist()


with explain_failures():  # if a rank fails, two lines say which and why
    for rank, (freed, kept, state, bias) in enumerate(dpteach.launch(try_it, world_size=3, timeout=60,
                                                                     backend="gloo", device="cpu")):
        # expect: True, 6 and 6 on every rank, and the same bias everywhere
        print(f"rank {rank}: .grad freed {freed}; keeps {kept} gradient and {state} momentum values; bias {bias}")
'''


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


def _held_bytes(optimizer, params) -> int:
    """Bytes in tensors reachable from the optimizer's attributes (through lists, tuples, sets and dicts),
    counted once per storage, leaving out storage shared with a parameter (the model's own weights)."""
    shared = {p.untyped_storage().data_ptr() for p in params}
    seen, storages = set(), {}
    pending = [(value, 0) for value in getattr(optimizer, "__dict__", {}).values()]
    while pending:
        value, depth = pending.pop()
        if id(value) in seen or depth > 4:
            continue
        seen.add(id(value))
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            if storage.data_ptr() not in shared:
                storages[storage.data_ptr()] = storage.nbytes()
        elif isinstance(value, dict):
            pending += [(item, depth + 1) for item in value.values()]
        elif isinstance(value, (list, tuple, set, frozenset)):
            pending += [(item, depth + 1) for item in value]
    return sum(storages.values())


def _check_memory(optimizer, params, ctx, total, when, later):
    for index, p in enumerate(params):
        if p.grad is not None:
            raise Fail(f"{when}, parameter {index} (shape {tuple(p.shape)}) still has a .grad: set p.grad = None "
                       f"for every parameter once its gradient is reduced - stage 2 keeps no full gradient{later}")
    slice_bytes = math.ceil(total / ctx.world) * params[0].element_size()
    held = _held_bytes(optimizer, params)
    if held > 2 * slice_bytes + 64:
        raise Fail(f"{when}, your optimizer holds {held // params[0].element_size()} elements in tensors of its "
                   f"own, more than a gradient slice and a momentum slice ({2 * math.ceil(total / ctx.world)}): a "
                   f"full-length buffer kept between calls is the memory stage 2 removes - build full-length tensors "
                   f"inside a call and let them go{later}")


def zero2_case(ctx, props, widths, steps, seed):
    model = _model(widths, seed)
    params = list(model.parameters())
    total = sum(p.numel() for p in params)
    grads, buffers, weights = _trajectory(widths, seed, ctx.world, steps)
    with ctx.running_learner_code():
        optimizer = ctx.learner("Zero2SGD")(params, LR, MOMENTUM)
    for step in range(steps):
        later = f" (step {step + 1} of {steps})" if steps > 1 else ""
        model.zero_grad(set_to_none=True)
        x, y = _batch(widths, seed, step, ctx.rank)
        loss = nn.functional.mse_loss(model(x), y)
        sent = ctx.sent_elements()
        with ctx.running_learner_code():
            loss.backward()
            optimizer.reduce_gradients()
        if "memory" in props:
            _check_memory(optimizer, params, ctx, total, "after reduce_gradients()", later)
        if "grad" in props:
            with ctx.running_learner_code():
                kept = optimizer.grad_slice()
            _check_slice(kept, "grad_slice()", sum(grads[step]) / ctx.world, ctx, total, later,
                         own=grads[step][ctx.rank])
        with ctx.running_learner_code():
            optimizer.step()
        sent = ctx.sent_elements() - sent
        if "traffic" in props and ctx.world > 1:
            _check_traffic(sent, ctx.world, total, later)
        if "memory" in props:
            _check_memory(optimizer, params, ctx, total, "after step()", later)
        if "state" in props:
            with ctx.running_learner_code():
                kept = optimizer.momentum_slice()
            _check_slice(kept, "momentum_slice()", buffers[step], ctx, total, later)
    if "weights" in props:
        for mine, expected in zip(params, weights):
            if not torch.allclose(mine.detach(), expected, atol=1e-10, rtol=1e-9):
                raise Fail("the weights differ from SGD with momentum on the gradient averaged over ranks: check "
                           "the division by W, the momentum update, and that every updated slice is gathered "
                           "and copied back into the parameters")


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


USES = ("Zero2SGD",)
HINT = ("reduce_gradients: flatten the .grad tensors in params order, ring_reduce_scatter them, divide by W, keep "
        "that slice, set every p.grad = None. step: buf = momentum * buf + grad on your slice, subtract lr * buf "
        "from your slice of the flat parameters, ring_all_gather, copy back into each parameter.")
ALL = ("memory", "grad", "state", "weights", "traffic")

CHECKS = (
    Check("W=2: after reduce_gradients no .grad is left, and the optimizer holds two slices at most", 2, 2,
          partial(zero2_case, props=("memory",), widths=(4, 6, 3), steps=2, seed=101), uses=USES, hint=HINT),
    Check("W=2: grad_slice() is this rank's slice of the averaged gradient, in a tensor of its own", 2, 2,
          partial(zero2_case, props=("grad",), widths=(4, 6, 3), steps=1, seed=102), uses=USES, hint=HINT),
    Check("W=2: momentum_slice() is this rank's slice of the momentum, in a tensor of its own", 1, 2,
          partial(zero2_case, props=("state",), widths=(4, 6, 3), steps=2, seed=103), uses=USES, hint=HINT),
    Check("W=2: three steps equal SGD with momentum on the averaged gradient", 3, 2,
          partial(zero2_case, props=("weights",), widths=(4, 6, 3), steps=3, seed=104), uses=USES, hint=HINT),
    Check("W=3: N not divisible by W", 2, 3,
          partial(zero2_case, props=("memory", "grad", "state", "weights"), widths=(3, 5, 2), steps=2, seed=105),
          uses=USES, hint=HINT),
    Check("W=3: one reduce-scatter and one all-gather per step, no more traffic", 1, 3,
          partial(zero2_case, props=("traffic",), widths=(3, 5, 2), steps=2, seed=106), uses=USES, hint=HINT),
    Check("hidden: larger world, deeper model, four steps", 2, 4,
          partial(zero2_case, props=ALL, widths=(5, 7, 4, 3), steps=4, seed=107), hidden=True, uses=USES, hint=HINT),
    Check("hidden: a world of one rank", 1, 1,
          partial(zero2_case, props=ALL, widths=(3, 4, 2), steps=2, seed=108), hidden=True, uses=USES, hint=HINT),
)


EXERCISE = Exercise(
    id="09", stem="09_zero2", title="ZeRO stage 2: sharded gradients and optimizer state (stretch)",
    names=("Zero2SGD",), stub=STUB, intro=INTRO, try_code=TRY, checks=CHECKS,
    forbidden=ZERO1.forbidden, forbidden_methods=ZERO1.forbidden_methods,
    rule="this exercise asks for reduce-scatter / update / all-gather, and your code all-reduces instead",
    after="That is the end of the exercises: `dpteach progress` shows where you stand.",
)
