"""Exercise 04: the overlap hook - launch each bucket's all-reduce from backward, wait before the step.

The learner writes ``OverlapSync(model, buckets)`` with ``hook(param)`` and ``finish()``. The grader runs
real backward passes on real ranks (``ex04_steps.py``) and watches every ``dist.all_reduce`` the learner
launches: whether it was launched during backward (the overlap) or only in ``finish()``, with
``async_op=True``, one per bucket in bucket order - also on a model whose buckets complete out of order on
some ranks, where launching each bucket as soon as it is complete makes the ranks add up different
buckets - and finished when ``finish()`` returns. The numbers are held to the average over ranks of each
rank's gradient, computed independently on every rank - which catches a missing division by W, a hook
that reduces the parameter instead of its gradient, and (over several steps) a bucket whose state from
the previous step is reused. Any way of waiting (work handles, futures, ``.then()``) and of averaging
(dividing by W, ``ReduceOp.AVG``) is judged by its result.
"""
from __future__ import annotations

from functools import partial

import torch

from ..spec import PROCESS_GROUP_METHODS, TORCH_COLLECTIVES, Check, Exercise
from .ex04_steps import overlap_case

STUB = '''\
import torch
import torch.distributed as dist


class OverlapSync:
    """Average gradients over the ranks, sending each bucket while backward is still running.

    buckets: a list of lists of parameters, in launch order (bucket 0 is sent first). It already
    follows DDP's reverse order: bucket 0 holds the last layer's parameters, whose gradients come first.
    """

    def __init__(self, model, buckets):
        """One flat buffer per bucket; register self.hook on every parameter with
        param.register_post_accumulate_grad_hook(self.hook)."""
        raise NotImplementedError("your code here")

    def hook(self, param):
        """Autograd calls this when param.grad is ready. Copy it into its bucket's buffer; once that
        bucket is complete, launch its all-reduce without waiting (async_op=True) - strictly in
        bucket order."""
        raise NotImplementedError("your code here")

    def finish(self):
        """Called after backward, before the optimizer step: wait for every all-reduce, write the
        averaged gradients (sum / W) back into each param.grad, and get ready for the next step."""
        raise NotImplementedError("your code here")
'''

HINT_AVERAGE = ("After a SUM all-reduce the buffer holds the sum over ranks: divide by W (or launch with "
                "op=dist.ReduceOp.AVG), then copy each parameter's slice back into param.grad (views make this "
                "one line per parameter).")
HINT_LAUNCH = ("Count, per bucket, how many gradients are still missing; when a bucket's count reaches 0, "
               "launch it - and every later bucket that is already complete - but never one before an "
               "earlier bucket has been launched.")
HINT_ORDER = ("Keep the index of the next bucket to launch. When a bucket completes, do not launch it unless it "
              "is that one; then launch buckets from the pointer on for as long as they are complete.")
HINT_STEPS = ("Everything that tracks a step's progress (missing counts, the next bucket to launch, the "
              "list of handles) must be reset for the next backward.")
ALL = ("average", "params", "launches", "overlap", "waited")
W, PLAN = (6, 8, 8, 4), [[5, 4], [3, 2], [1, 0]]
BIG, BIG_PLAN = (5, 7, 6, 3, 2), [[7, 6, 5], [4, 3], [2], [1, 0]]
# _Branches: parameters 0-1 branch 0, 2-3 branch 1, 4-5 the head; the two branch buckets are the same size,
# so ranks that launch them in different orders add up wrong numbers instead of crashing gloo.
TWIN, TWIN_PLAN = ("branches", 5, 6, 3), [[5, 4], [1, 0], [3, 2]]
f32, f64 = torch.float32, torch.float64

CHECKS = (
    Check("W=2: after finish(), every .grad is the average over ranks", 2, 2,
          partial(overlap_case, props=("average",), widths=W, plan=PLAN, steps=1, dtype=f32, seed=51), hint=HINT_AVERAGE),
    Check("W=2: the hook reduces gradients, never the parameters", 1, 2,
          partial(overlap_case, props=("params",), widths=W, plan=PLAN, steps=1, dtype=f32, seed=52), hint="param.grad is the gradient; param (and param.data) are the weights."),
    Check("W=2: one async all-reduce per bucket, launched in bucket order", 2, 2,
          partial(overlap_case, props=("launches",), widths=W, plan=PLAN, steps=1, dtype=f32, seed=53), hint=HINT_LAUNCH),
    Check("W=2: every all-reduce starts during backward (overlap), not in finish()", 2, 2,
          partial(overlap_case, props=("overlap",), widths=W, plan=PLAN, steps=1, dtype=f32, seed=54), hint=HINT_LAUNCH),
    Check("W=2: finish() waits for every all-reduce", 1, 2,
          partial(overlap_case, props=("waited",), widths=W, plan=PLAN, steps=1, dtype=f32, seed=55), hint="Keep each handle that dist.all_reduce(..., async_op=True) returns; wait() on all of them."),
    Check("W=2: three steps in a row, nothing stale from the step before", 2, 2,
          partial(overlap_case, props=ALL, widths=W, plan=PLAN, steps=3, dtype=f32, seed=56), hint=HINT_STEPS),
    Check("W=2: buckets complete out of order on one rank, and are still launched in bucket order", 2, 2,
          partial(overlap_case, props=("order",) + ALL, widths=TWIN, plan=TWIN_PLAN, steps=2, dtype=f32,
                  seed=60), hint=HINT_ORDER),
    Check("larger world, float64, uneven buckets, two steps", 2, 3,
          partial(overlap_case, props=ALL, widths=BIG, plan=BIG_PLAN, steps=2, dtype=f64, seed=57),
          hidden=True, hint=HINT_STEPS),
    Check("larger world, one bucket per parameter, three steps", 2, 4,
          partial(overlap_case, props=ALL, widths=W, plan=[[5], [4], [3], [2], [1], [0]], steps=3, dtype=f32,
                  seed=58), hidden=True, hint=HINT_LAUNCH),
    Check("larger world, a single bucket for the whole model", 1, 4,
          partial(overlap_case, props=ALL, widths=W, plan=[[5, 4, 3, 2, 1, 0]], steps=2, dtype=f32, seed=59),
          hidden=True, hint=HINT_LAUNCH),
    Check("larger world, buckets complete in a different order on different ranks", 1, 4,
          partial(overlap_case, props=("order",) + ALL, widths=TWIN, plan=TWIN_PLAN, steps=2, dtype=f64,
                  seed=61), hidden=True, hint=HINT_ORDER),
)


EXERCISE = Exercise(
    id="04", stem="04_overlap_hook", title="Overlap: all-reduce from backward hooks", names=("OverlapSync",),
    stub=STUB, checks=CHECKS,
    forbidden=tuple(name for name in TORCH_COLLECTIVES if name != "torch.distributed.all_reduce") + (
        "torch.nn.parallel.DistributedDataParallel", "dpteach.sync.overlap.OverlapSync"),
    forbidden_methods=tuple(m for m in PROCESS_GROUP_METHODS if m != "allreduce"),
    rule="this exercise asks you to build the overlap yourself with dist.all_reduce, and your code uses "
         "another collective or a ready-made synchroniser",
)
