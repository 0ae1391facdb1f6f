"""Exercise 03: bucket assignment by the course's simple rule (after DDP's), and flat buffers
with a view per gradient.

``assign_buckets(sizes, cap_bytes, first_cap_bytes)`` is checked against the course's rule (reverse order; a
bucket closes once it holds at least the cap, the parameter that crosses it included; a smaller first
cap) on hand-picked and seeded random sizes. ``flatten(grads)`` must return a *new* flat buffer and
views that share its memory - a copy would look right and silently break the all-reduce-then-read-back
that bucketing relies on. Finally both run together on real ranks: the grader averages each of the
learner's flat buffers over the ranks and reads the averaged gradients back through the learner's views.
The views are judged again outside the ranks like everything else: the recording keeps which tensors
share a buffer (``grading/replay.py``).
"""
from __future__ import annotations

import random
from functools import partial

import torch

from ..spec import Check, Exercise, Fail
from .common import everyones, secret_seed

STUB = '''\
import torch


def assign_buckets(sizes, cap_bytes, first_cap_bytes):
    """Group parameter indices into buckets the way PyTorch DDP does; return a list of lists of indices.

    sizes[i] is the size in bytes of parameter i's gradient, in model.parameters() order.
    Go through the parameters in reverse order (the order backward produces their gradients) and add
    each one to the current bucket. A bucket closes as soon as it holds at least its cap - the
    parameter that crosses the cap stays in it. The first bucket's cap is first_cap_bytes, every
    later bucket's is cap_bytes. A last bucket that never reached its cap is kept as it is.
    """
    raise NotImplementedError("your code here")


def flatten(grads):
    """Pack a list of same-dtype tensors into one flat buffer; return (flat, views).

    flat:  a new 1-D contiguous tensor holding the elements of grads[0], grads[1], ... in that order.
    views: views[i] is a view into flat with the shape of grads[i]: writing through it writes flat,
           and a change to flat shows through it. grads themselves are left unchanged.
    """
    raise NotImplementedError("your code here")
'''


def reference_buckets(sizes, cap, first_cap, closes_before=False, ignore_first=False):
    """The course's rule, and two tempting mistakes (to name them when a learner makes them)."""
    buckets, current, total = [], [], 0
    for index in reversed(range(len(sizes))):
        limit = cap if (buckets or ignore_first) else first_cap
        if closes_before and current and total + sizes[index] > limit:
            buckets.append(current)
            current, total = [], 0
        current.append(index)
        total += sizes[index]
        if total >= limit:
            buckets.append(current)
            current, total = [], 0
    if current:
        buckets.append(current)
    return buckets


def _checked_buckets(got, count: int):
    if not isinstance(got, (list, tuple)) or not all(isinstance(b, (list, tuple)) for b in got):
        raise Fail("assign_buckets should return a list of lists of parameter indices")
    flat = [i for bucket in got for i in bucket]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in flat):
        raise Fail("the buckets should hold parameter indices (ints)")
    if sorted(flat) != list(range(count)) or any(len(b) == 0 for b in got):
        raise Fail("every parameter index 0..n-1 must appear in exactly one bucket, and no bucket may be empty")
    return [list(b) for b in got]


def assign_case(ctx, cases):
    for sizes, cap, first_cap in cases:
        got = _checked_buckets(ctx.call("assign_buckets", list(sizes), cap, first_cap), len(sizes))
        if got == reference_buckets(sizes, cap, first_cap):
            continue
        order = [i for bucket in got for i in bucket]
        if order != sorted(order, reverse=True):
            raise Fail("the buckets are not filled in reverse parameter order (last parameter first)")
        if got == reference_buckets(sizes, cap, first_cap, closes_before=True):
            raise Fail("a bucket closed before the parameter that crosses the cap joined it; that parameter "
                       "belongs in the bucket it fills")
        if got == reference_buckets(sizes, cap, first_cap, ignore_first=True):
            raise Fail("the first bucket must use first_cap_bytes, the later ones cap_bytes")
        raise Fail("the buckets differ from the rule (reverse order, close once at least the cap, "
                   "smaller first cap)")


def random_cases(seed: int, count: int):
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        sizes = [rng.choice([4, 40, 400, 4000, 40000]) * rng.randint(1, 9) for _ in range(rng.randint(2, 14))]
        cases.append((sizes, rng.choice([1000, 5000, 20000, 80000]), rng.choice([500, 2000, 20000])))
    return cases


def _grads(shapes, dtype, seed):
    generator = torch.Generator().manual_seed(seed % 2 ** 63)
    return [torch.randn(shape, generator=generator).to(dtype) for shape in shapes]


def flatten_case(ctx, shapes, dtype, seed):
    grads = _grads(shapes, dtype, seed)
    originals = [g.clone() for g in grads]
    result = ctx.call("flatten", grads)
    if not isinstance(result, tuple) or len(result) != 2:
        raise Fail("flatten should return a pair (flat, views)")
    flat, views = result
    if not isinstance(flat, torch.Tensor) or flat.dim() != 1 or not flat.is_contiguous():
        raise Fail("flat should be a 1-D contiguous tensor")
    if flat.dtype != dtype:
        raise Fail("flat should have the gradients' dtype")
    if flat.numel() != sum(g.numel() for g in grads) or not torch.equal(flat, torch.cat([g.reshape(-1) for g in grads])):
        raise Fail("flat should hold every element of every gradient, gradient after gradient, in list order")
    if not isinstance(views, (list, tuple)) or len(views) != len(grads) or \
            not all(isinstance(v, torch.Tensor) for v in views):
        raise Fail("views should be a list with one tensor per gradient")
    if any(v.shape != g.shape for v, g in zip(views, grads)):
        raise Fail("each view should have its gradient's shape")
    if any(not torch.equal(g, o) for g, o in zip(grads, originals)):
        raise Fail("flatten changed the gradients it was given")
    flat.mul_(2).add_(1)
    if any(not torch.equal(g, o) for g, o in zip(grads, originals)):
        raise Fail("flat shares memory with a gradient: it should be a new buffer")
    if any(not torch.equal(v, o * 2 + 1) for v, o in zip(views, originals)):
        raise Fail("a change to flat does not show through the views: they should be views into flat, not copies")
    for view in views:
        view.zero_()
    if flat.count_nonzero() != 0:
        raise Fail("writing through the views does not reach flat: they should be views into flat")


def bucketed_sync_case(ctx, shapes, cap, first_cap, seed):
    """On real ranks: average gradients bucket by bucket through the learner's buckets and views."""
    world = ctx.world
    mine_seed = secret_seed(ctx, seed * 10)  # the same public seed on every rank: common.py
    mine = _grads(shapes, torch.float32, mine_seed)
    sizes = [g.numel() * g.element_size() for g in mine]
    buckets = _checked_buckets(ctx.call("assign_buckets", sizes, cap, first_cap), len(sizes))
    for bucket in buckets:
        result = ctx.call("flatten", [mine[i] for i in bucket])
        if not isinstance(result, tuple) or len(result) != 2 or not isinstance(result[0], torch.Tensor):
            raise Fail("flatten should return a pair (flat, views)")
        flat, views = result
        gathered = ctx.all_gather(flat.detach().reshape(-1).clone())  # the grader's own exchange, not the learner's
        flat.copy_((sum(gathered) / world).view_as(flat))
        for i, view in zip(bucket, views):
            mine[i].copy_(view)
    seeds = everyones(ctx, mine_seed)
    average = [sum(_grads(shapes, torch.float32, s)[i] for s in seeds) / world for i in range(len(shapes))]
    if any(not torch.allclose(g, a, atol=1e-6) for g, a in zip(mine, average)):
        raise Fail("after all-reducing each bucket's flat buffer and reading the gradients back through the "
                   "views, some gradient is not the average over ranks")


HINT_ASSIGN = ("Walk the parameters from the last to the first, keep a running byte count, and close the "
               "bucket right after adding the parameter that brings it to the cap or beyond.")
HINT_VIEWS = ("Allocate flat once (torch.empty / zeros of the total length), then for each gradient take "
              "flat[offset:offset + g.numel()].view(g.shape) and copy the gradient into it.")
USES_A, USES_F, BOTH = ("assign_buckets",), ("flatten",), ("assign_buckets", "flatten")

CHECKS = (
    Check("assign_buckets: reverse order, equal sizes", 1, 1,
          partial(assign_case, cases=[([4, 4, 4, 4], 8, 8), ([4, 4, 4, 4, 4, 4], 12, 12)]), uses=USES_A,
          hint=HINT_ASSIGN),
    Check("assign_buckets: the parameter that crosses the cap joins the bucket", 2, 1,
          partial(assign_case, cases=[([3, 3, 3, 3, 3], 5, 5), ([100, 1, 100, 1], 50, 50)]), uses=USES_A,
          hint=HINT_ASSIGN),
    Check("assign_buckets: the first bucket uses first_cap_bytes", 2, 1,
          partial(assign_case, cases=[([4, 4, 4, 4, 4, 4], 12, 4), ([10] * 7, 25, 5)]), uses=USES_A,
          hint=HINT_ASSIGN),
    Check("flatten: one new 1-D buffer holding every gradient in order (float32)", 1, 1,
          partial(flatten_case, shapes=[(2, 3), (4,), (3, 1, 2)], dtype=torch.float32, seed=41), uses=USES_F,
          hint=HINT_VIEWS),
    Check("flatten: the views share the buffer's memory and have the gradients' shapes", 2, 1,
          partial(flatten_case, shapes=[(5,), (2, 2), (1,)], dtype=torch.float32, seed=42), uses=USES_F,
          hint=HINT_VIEWS),
    Check("W=2: all-reducing each bucket's flat buffer averages every gradient", 2, 2,
          partial(bucketed_sync_case, shapes=[(8, 4), (8,), (3, 8), (3,)], cap=100, first_cap=40, seed=43),
          uses=BOTH, hint=HINT_VIEWS),
    Check("assign_buckets, random sizes and caps", 2, 1,
          partial(assign_case, cases=random_cases(44, 12)), hidden=True, uses=USES_A, hint=HINT_ASSIGN),
    Check("assign_buckets, parameters larger than the cap", 1, 1,
          partial(assign_case, cases=[([1, 100, 1], 10, 10), ([100], 10, 5), ([7, 7], 1, 1)]), hidden=True,
          uses=USES_A, hint=HINT_ASSIGN),
    Check("assign_buckets, a first cap larger than the others", 1, 1,
          partial(assign_case, cases=[([4] * 8, 5, 20), ([], 8, 8)]), hidden=True, uses=USES_A, hint=HINT_ASSIGN),
    Check("flatten, float64 and 0-d tensors", 1, 1,
          partial(flatten_case, shapes=[(), (3, 2), (), (1, 1, 1)], dtype=torch.float64, seed=45), hidden=True,
          uses=USES_F, hint=HINT_VIEWS),
    Check("many buckets of mixed sizes, on real ranks", 1, 2,
          partial(bucketed_sync_case, shapes=[(6, 5), (6,), (5, 6), (5,), (2, 5), (2,)], cap=64, first_cap=16,
                  seed=46), hidden=True, uses=BOTH, hint=HINT_VIEWS),
)

EXERCISE = Exercise(
    id="03", stem="03_buckets", title="Buckets and flat buffers", names=("assign_buckets", "flatten"), stub=STUB,
    checks=CHECKS,
    forbidden=("dpteach.replica.buckets.assign_buckets", "dpteach.replica.buckets.build_buckets",
               "torch.distributed._compute_bucket_assignment_by_size"),
    rule="this exercise asks you to assign the buckets yourself, and your code calls a ready-made assignment",
)
