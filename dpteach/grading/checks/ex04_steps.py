"""Exercise 04's backward passes: the models, the learner's OverlapSync driven through real steps, and what
each step is judged on (``ex04_overlap.py`` holds the exercise's text and its list of checks).

Every ``dist.all_reduce`` the learner launches is watched through the guard's profiler: when it was
launched (during backward, or in ``finish()``), with ``async_op=True`` or not, on which buffer, and what the
buffer held at that moment - which tells the bucket it carries, so the launch order is judged by content
where buckets have the same size. Whether ``finish()`` waited is judged from what it leaves behind, never
from a handle's state: gloo marks a work's future done a moment before ``work.is_completed()`` says so,
and a check that asked the handle failed correct code at random.

The learner's object lives in the rank only, so the rank *drives* it (``_start``, ``_step``: run through
``ctx.drive``) and records what each step left - every launch, the gradients, the parameters - and the
judging that follows runs on that record, in the rank and again in the replay outside it. Each step's
batches are drawn from every rank's own secret salt, learned only after the step (``common.py``).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from ..spec import Fail, observes
from .common import everyones, secret_seed

PEER_DELAY = 0.2  # seconds the last rank holds back its first backward in a check of "waited"


class _Branches(nn.Module):
    """Two branches side by side, then a head. Backward reaches first the branch whose forward ran last,
    and the order of the forward is chosen per rank: on even ranks bucket 2 (branch 1) is complete before
    bucket 1, on odd ranks after it. Ranks that launch each bucket as soon as it is complete then launch
    different buckets at the same position; gloo matches collectives by launch order and adds them up."""

    def __init__(self, widths):
        super().__init__()
        d, h, o = widths
        self.branches = nn.ModuleList([nn.Linear(d, h), nn.Linear(d, h)])
        self.head = nn.Linear(h, o)

    def forward(self, x, rank):
        out = {i: torch.tanh(self.branches[i](x)) for i in ((0, 1) if rank % 2 == 0 else (1, 0))}
        return self.head(out[0] + out[1])


def _model(widths, dtype, seed):
    torch.manual_seed(seed)
    if widths[0] == "branches":
        return _Branches(widths[1:]).to(dtype)
    layers = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1]).to(dtype)


def _loss(model, widths, dtype, seed, step, rank):
    """The loss of ``rank``'s batch at ``step``, drawn from ``seed`` (the public one mixed with the rank's salt)."""
    generator = torch.Generator().manual_seed((seed * 1000 + step * 31 + rank) % 2 ** 63)
    x = torch.randn(4, widths[1 if widths[0] == "branches" else 0], generator=generator).to(dtype)
    y = torch.randn(4, widths[-1], generator=generator).to(dtype)
    out = model(x, rank) if isinstance(model, _Branches) else model(x)
    return nn.functional.mse_loss(out, y)


def _gradients(widths, dtype, seed, step, rank, batch_seed=None):
    """``rank``'s gradient at ``step``: the model drawn from ``seed``, the batch from ``batch_seed`` (or ``seed``)."""
    model = _model(widths, dtype, seed)
    _loss(model, widths, dtype, seed if batch_seed is None else batch_seed, step, rank).backward()
    return [p.grad.clone() for p in model.parameters()]


def overlap_case(ctx, props, widths, plan, steps, dtype, seed):
    """Run ``steps`` backward passes through the learner's OverlapSync; check the properties ``props``.

    "waited" is judged from what finish() leaves behind, never from a handle's state (which lags behind
    on gloo): on the first step the last rank starts its backward ``PEER_DELAY`` seconds late, so the
    other ranks' all-reduces are still running when their finish() returns unless it waits for them.
    What each launched buffer held at that moment must not change once the grader has waited for them.
    """
    live = {}  # the learner's object and the model: in the rank only, never in the replay
    ctx.drive(_start, live, widths, plan, dtype, seed)
    start = [p.detach() for p in _model(widths, dtype, seed).parameters()]
    bucket_numels = [sum(start[i].numel() for i in bucket) for bucket in plan]
    tol = 1e-5 if dtype == torch.float32 else 1e-10
    for step in range(steps):
        batch_seed = secret_seed(ctx, seed)  # a fresh salt each step
        seen = ctx.drive(_step, live, props, widths, dtype, step, batch_seed)
        seeds = everyones(ctx, batch_seed)  # only now: see common.py
        local = _gradients(widths, dtype, seed, step, ctx.rank, seeds[ctx.rank])
        average = [sum(g) / ctx.world for g in zip(*(_gradients(widths, dtype, seed, step, r, s)
                                                     for r, s in enumerate(seeds)))]
        launches, later = seen["launches"], f" (step {step + 1} of {steps})" if steps > 1 else ""
        if "params" in props and any(not torch.equal(p, b) for p, b in zip(seen["params"], start)):
            raise Fail("a parameter's values changed: the hook must all-reduce the gradient (param.grad), "
                       "never the parameter itself")
        if "order" in props:
            _check_order(launches, [torch.cat([local[i].reshape(-1) for i in b]) for b in plan], ctx.world, later)
        if "launches" in props:
            _check_launches(launches, bucket_numels, later)
        if "overlap" in props and not all(launch["backward"] for launch in launches):
            raise Fail("an all-reduce was launched after backward had finished (in finish()): launch each "
                       "bucket from the hook, as soon as its last gradient has arrived" + later)
        if "overlap" in props and seen["stalled"]:
            raise Fail("an all-reduce was waited on during backward: that stalls backward until the bucket "
                       "has been sent, so nothing overlaps; wait only in finish()" + later)
        if "waited" in props and any(h is not None and not torch.equal(h, a) for h, a in zip(seen["held"],
                                                                                          seen["after_wait"])):
            raise Fail("finish() returned while an all-reduce was still running: its buffer changed after "
                       "finish() had returned. wait() on every handle (or its future) before reading the "
                       "buffers" + later)
        if "average" in props:
            _check_average(seen["grads"], local, average, ctx.world, tol, later)


@observes
def _start(ctx, live, widths, plan, dtype, seed):
    """Build the model, watch every all-reduce the learner launches, construct the learner's OverlapSync."""
    model = _model(widths, dtype, seed)
    params = list(model.parameters())
    launches, state = [], {"backward": False, "stalled": False, "then": 0}

    def on_all_reduce(event, frame, arg):
        if event == "call":
            tensor = frame.f_locals.get("tensor")
            tensor = tensor if isinstance(tensor, torch.Tensor) else None
            launches.append({"backward": state["backward"], "async": bool(frame.f_locals.get("async_op")),
                             "numel": -1 if tensor is None else tensor.numel(), "tensor": tensor,
                             "sent": None if tensor is None else tensor.detach().clone(), "work": None})
        elif event == "return" and launches:
            launches[-1]["work"] = arg

    def on_c_call(event, builtin):  # work.wait(), future.wait(), torch.futures.wait_all(...) during backward
        name = getattr(builtin, "__name__", "")
        if name == "then":  # a callback run inside then() runs at once on a future that is done already:
            state["then"] += 1 if event == "c_call" else -1  # waiting on it inside the callback stalls nothing
        elif event == "c_call" and state["backward"] and not state["then"] and name in ("wait", "_wait_all"):
            state["stalled"] = True

    ctx.guard.watch(dist.distributed_c10d.all_reduce, on_all_reduce)
    ctx.guard.watch_c_calls(on_c_call)
    with ctx.running_learner_code():
        sync = ctx.learner("OverlapSync")(model, [[params[i] for i in bucket] for bucket in plan])
    live.update(model=model, params=params, launches=launches, state=state, sync=sync)


@observes
def _step(ctx, live, props, widths, dtype, step, batch_seed):
    """One backward pass and finish(); what they left: launches, gradients, parameters, buffers."""
    model, params, launches, state = live["model"], live["params"], live["launches"], live["state"]
    for p in params:
        p.grad = None
    loss = _loss(model, widths, dtype, batch_seed, step, ctx.rank)
    launches.clear()
    state["stalled"], state["then"] = False, 0
    if "waited" in props and step == 0 and ctx.world > 1:
        dist.barrier()  # the grader's own, before any all-reduce of this step: the ranks start together
        if ctx.rank == ctx.world - 1:
            time.sleep(PEER_DELAY)
    with ctx.running_learner_code():
        state["backward"] = True
        loss.backward()
        state["backward"] = False
        live["sync"].finish()
    grads = [None if p.grad is None else p.grad.detach().clone() for p in params]  # at once: see above
    held = [None if launch["tensor"] is None else launch["tensor"].detach().clone() for launch in launches]
    after = held
    if "waited" in props:
        with ctx.allow():
            for launch in launches:
                if launch["work"] is not None:
                    launch["work"].wait()
        after = [None if launch["tensor"] is None else launch["tensor"].detach().clone() for launch in launches]
    return {"grads": grads, "params": [p.detach().clone() for p in params], "held": held, "after_wait": after,
            "stalled": state["stalled"],
            "launches": [{key: launch[key] for key in ("backward", "async", "numel", "sent")} for launch in launches]}


def _bucket_of(sent, flat_grads, world):
    """The bucket whose gradients a launched buffer held (in any layout; divided by W already, for code
    that divides before it sums), or None."""
    values = sent.detach().reshape(-1).to(torch.float64).sort().values
    for index, flat in enumerate(flat_grads):
        expected = flat.to(torch.float64).sort().values
        if values.shape == expected.shape and any(torch.allclose(values, e, rtol=1e-4, atol=1e-6)
                                                  for e in (expected, expected / world)):
            return index
    return None


def _check_order(launches, flat_grads, world, later):
    found = [_bucket_of(launch["sent"], flat_grads, world) for launch in launches if launch["sent"] is not None]
    found = [index for index in found if index is not None]
    for first, then in zip(found, found[1:]):
        if then < first:
            raise Fail(f"bucket {then} was launched after bucket {first}: on this rank bucket {first} was complete "
                       f"first, but on other ranks the buckets complete in another order, and gloo matches "
                       f"collectives by the order of their launch - the ranks added up different buckets. Launch "
                       f"a complete bucket only once every bucket before it has been launched" + later)


def _check_launches(launches, bucket_numels, later):
    if not launches:
        raise Fail("no dist.all_reduce was launched" + later)
    if len(launches) != len(bucket_numels):
        raise Fail("the number of all-reduces differs from the number of buckets: launch exactly one per "
                   "bucket per step" + later)
    if not all(launch["async"] for launch in launches):
        raise Fail("an all-reduce was launched without async_op=True: it would block backward until it "
                   "finished, and nothing would overlap" + later)
    if [launch["numel"] for launch in launches] != bucket_numels:
        raise Fail("the all-reduces were not launched in bucket order, one flat buffer per bucket (bucket 0 "
                   "first)" + later)


def _check_average(grads, local, average, world, tol, later):
    for grad, mine, mean in zip(grads, local, average):
        if grad is None:
            raise Fail("a parameter's .grad is None after finish()" + later)
        if grad.shape != mean.shape:
            raise Fail("a parameter's .grad has the wrong shape after finish()" + later)
        if torch.allclose(grad, mean, atol=tol, rtol=tol):
            continue
        if world > 1 and torch.allclose(grad, mean * world, atol=tol, rtol=tol):
            raise Fail("the gradients are the sum over ranks, not the average: divide by W" + later)
        if world > 1 and torch.allclose(grad, mine, atol=tol, rtol=tol):
            raise Fail("a gradient is still this rank's own: it was not averaged, or not written back" + later)
        raise Fail("after finish(), a parameter's .grad is not the average of the ranks' gradients" + later)
