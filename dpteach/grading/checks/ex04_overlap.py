"""Exercise 04: the overlap hook - launch each bucket's all-reduce from backward, wait before the step.

The learner writes ``OverlapSync(model, buckets)`` with ``hook(param)`` and ``finish()``. The grader runs
real backward passes on real ranks and watches, through the guard's profiler, every ``dist.all_reduce``
the learner launches: whether it was launched during backward (the overlap) or only in ``finish()``,
with ``async_op=True``, one per bucket in bucket order, and waited on before ``finish()`` returns. The
numbers are held to the average over ranks of each rank's gradient, computed independently on every
rank - which catches a missing division by W, a hook that reduces the parameter instead of its
gradient, and (over several steps) a bucket whose state from the previous step is reused.
"""
from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist
from torch import nn

from ..spec import PROCESS_GROUP_METHODS, TORCH_COLLECTIVES, Check, Exercise, Fail

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

INTRO = """\
# Exercise 04 - overlap: communicate while backward computes

Backward produces gradients from the last layer to the first. As soon as every gradient of a bucket is
ready, its all-reduce can start - *asynchronously*, so that backward carries on with the earlier layers
while the bucket is on the wire. Only the communication still in flight when backward ends is exposed.
This is what DDP does, and you now build it (compare with `dpteach/sync/overlap.py` afterwards).

**What to write:** a class `OverlapSync(model, buckets)`:

* `__init__` - one flat buffer per bucket (exercise 03), and `param.register_post_accumulate_grad_hook(self.hook)`
  on every parameter. That hook fires once per backward, after the gradient has been accumulated into
  `param.grad`, and it receives the **parameter**: the gradient is `param.grad`.
* `hook(param)` - copy `param.grad` into its bucket's buffer; when the bucket is complete, launch
  `dist.all_reduce(buffer, async_op=True)` and keep the returned work handle. Launch buckets **in bucket
  order**: collectives are matched by the order of their launch, so two ranks launching different
  buckets first would add up different tensors.
* `finish()` - `wait()` on every handle, divide by W (gloo has no average) and write each gradient back
  into `param.grad`; then reset whatever you track per step, so the next backward starts clean.

**Hints.** Gradients do not always become ready in bucket order (a layer whose output is used twice, or
a small bucket that fills before a large one). When bucket 2 is complete but bucket 1 is not, do not
launch 2: remember that it is ready, and each time a bucket completes, launch the next *unlaunched*
bucket as long as it is complete - a pointer to the next bucket to launch does it. The checks give every
parameter a gradient, but real models do not always: a parameter that got no gradient in a backward (its
hook never fired) would leave its bucket incomplete for ever. In `finish()`, fill its part of the buffer
with zeros and launch what is left, in order, before waiting - the same ranks must launch the same
buckets (what DDP's `find_unused_parameters=True` arranges, lesson 03).

**Rules:** `dist.all_reduce` is allowed here (the exercise is *when* to launch it, not how it works); other
collectives, `DistributedDataParallel` and dpteach's own `OverlapSync` score zero.
"""

TRY = '''\
import dpteach
from dpteach.grading import explain_failures
from torch import nn


def try_it():
    torch.manual_seed(0)                                   # the same weights on every rank
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    params = list(model.parameters())
    sync = OverlapSync(model, [[params[3], params[2]], [params[1], params[0]]])
    torch.manual_seed(1 + dist.get_rank())                 # different data on every rank
    loss = model(torch.randn(5, 4)).pow(2).mean()
    loss.backward()
    sync.finish()
    return params[3].grad.tolist()                         # the same on every rank once averaged


with explain_failures():  # if a rank fails, two lines say which and why
    for rank, grad in enumerate(dpteach.launch(try_it, world_size=2, timeout=60, backend="gloo", device="cpu")):
        print(f"rank {rank}: last bias gradient {grad}")
'''


def _model(widths, dtype, seed):
    torch.manual_seed(seed)
    layers = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1]).to(dtype)


def _batch(widths, dtype, seed, step, rank):
    generator = torch.Generator().manual_seed(seed * 1000 + step * 31 + rank)
    return (torch.randn(4, widths[0], generator=generator).to(dtype),
            torch.randn(4, widths[-1], generator=generator).to(dtype))


def _gradients(widths, dtype, seed, step, rank):
    model = _model(widths, dtype, seed)
    x, y = _batch(widths, dtype, seed, step, rank)
    nn.functional.mse_loss(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def overlap_case(ctx, props, widths, plan, steps, dtype, seed):
    """Run ``steps`` backward passes through the learner's OverlapSync; check the properties ``props``."""
    model = _model(widths, dtype, seed)
    params = list(model.parameters())
    buckets = [[params[i] for i in bucket] for bucket in plan]
    launches, waits, state = [], [], {"backward": False}

    def on_all_reduce(event, frame, arg):
        if event == "call":
            tensor = frame.f_locals.get("tensor")
            launches.append({"backward": state["backward"], "async": bool(frame.f_locals.get("async_op")),
                             "numel": tensor.numel() if isinstance(tensor, torch.Tensor) else -1, "work": None})
        elif event == "return" and launches:
            launches[-1]["work"] = arg

    def on_c_call(builtin):  # work.wait(), future.wait(), torch.futures.wait_all(...)
        name = getattr(builtin, "__name__", "")
        if name in ("wait", "_wait_all", "wait_all"):
            waits.append((name, state["backward"]))

    ctx.guard.watch(dist.distributed_c10d.all_reduce, on_all_reduce)
    ctx.guard.watch_c_calls(on_c_call)
    with ctx.running_learner_code():
        sync = ctx.learner("OverlapSync")(model, buckets)
    tol = 1e-5 if dtype == torch.float32 else 1e-10
    for step in range(steps):
        before = [p.detach().clone() for p in params]
        local = _gradients(widths, dtype, seed, step, ctx.rank)
        average = [sum(g) / ctx.world for g in zip(*(_gradients(widths, dtype, seed, step, r)
                                                     for r in range(ctx.world)))]
        for p in params:
            p.grad = None
        x, y = _batch(widths, dtype, seed, step, ctx.rank)
        loss = nn.functional.mse_loss(model(x), y)
        launches.clear()
        waits.clear()
        with ctx.running_learner_code():
            state["backward"] = True
            loss.backward()
            state["backward"] = False
            sync.finish()
        later = f" (step {step + 1} of {steps})" if steps > 1 else ""
        if "params" in props and any(not torch.equal(p.detach(), b) for p, b in zip(params, before)):
            raise Fail("a parameter's values changed: the hook must all-reduce the gradient (param.grad), "
                       "never the parameter itself")
        if "launches" in props:
            _check_launches(launches, [sum(p.numel() for p in b) for b in buckets], later)
        if "overlap" in props and not all(launch["backward"] for launch in launches):
            raise Fail("an all-reduce was launched after backward had finished (in finish()): launch each "
                       "bucket from the hook, as soon as its last gradient has arrived" + later)
        if "overlap" in props and any(during for _, during in waits):
            raise Fail("an all-reduce was waited on during backward: that stalls backward until the bucket "
                       "has been sent, so nothing overlaps; wait only in finish()" + later)
        if "waited" in props:
            handles = [launch["work"] for launch in launches if launch["work"] is not None]
            enough = len(waits) >= len(handles) or any(name != "wait" for name, _ in waits)
            if not enough or not all(work.is_completed() for work in handles):
                raise Fail("finish() returned without waiting for every all-reduce: call wait() on each "
                           "handle before reading the buffers" + later)
        if "average" in props:
            _check_average(params, local, average, ctx.world, tol, later)


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


def _check_average(params, local, average, world, tol, later):
    for p, mine, mean in zip(params, local, average):
        if p.grad is None:
            raise Fail("a parameter's .grad is None after finish()" + later)
        if p.grad.shape != mean.shape:
            raise Fail("a parameter's .grad has the wrong shape after finish()" + later)
        if torch.allclose(p.grad, mean, atol=tol, rtol=tol):
            continue
        if world > 1 and torch.allclose(p.grad, mean * world, atol=tol, rtol=tol):
            raise Fail("the gradients are the sum over ranks, not the average: divide by W" + later)
        if world > 1 and torch.allclose(p.grad, mine, atol=tol, rtol=tol):
            raise Fail("a gradient is still this rank's own: it was not averaged, or not written back" + later)
        raise Fail("after finish(), a parameter's .grad is not the average of the ranks' gradients" + later)


HINT_AVERAGE = ("The buffer after the all-reduce holds the sum over ranks; divide by W, then copy each "
                "parameter's slice back into param.grad (views make this one line per parameter).")
HINT_LAUNCH = ("Count, per bucket, how many gradients are still missing; when a bucket's count reaches 0, "
               "launch it - and every later bucket that is already complete - but never one before an "
               "earlier bucket has been launched.")
HINT_STEPS = ("Everything that tracks a step's progress (missing counts, the next bucket to launch, the "
              "list of handles) must be reset for the next backward.")
ALL = ("average", "params", "launches", "overlap", "waited")
W, PLAN = (6, 8, 8, 4), [[5, 4], [3, 2], [1, 0]]
BIG, BIG_PLAN = (5, 7, 6, 3, 2), [[7, 6, 5], [4, 3], [2], [1, 0]]
USES = ("OverlapSync",)
f32, f64 = torch.float32, torch.float64

CHECKS = (
    Check("W=2: after finish(), every .grad is the average over ranks", 2, 2,
          partial(overlap_case, props=("average",), widths=W, plan=PLAN, steps=1, dtype=f32, seed=51),
          uses=USES, hint=HINT_AVERAGE),
    Check("W=2: the hook reduces gradients, never the parameters", 1, 2,
          partial(overlap_case, props=("params",), widths=W, plan=PLAN, steps=1, dtype=f32, seed=52),
          uses=USES, hint="param.grad is the gradient; param (and param.data) are the weights."),
    Check("W=2: one async all-reduce per bucket, launched in bucket order", 2, 2,
          partial(overlap_case, props=("launches",), widths=W, plan=PLAN, steps=1, dtype=f32, seed=53),
          uses=USES, hint=HINT_LAUNCH),
    Check("W=2: every all-reduce starts during backward (overlap), not in finish()", 2, 2,
          partial(overlap_case, props=("overlap",), widths=W, plan=PLAN, steps=1, dtype=f32, seed=54),
          uses=USES, hint=HINT_LAUNCH),
    Check("W=2: finish() waits for every all-reduce", 1, 2,
          partial(overlap_case, props=("waited",), widths=W, plan=PLAN, steps=1, dtype=f32, seed=55),
          uses=USES, hint="Keep each handle that dist.all_reduce(..., async_op=True) returns; wait() on all of them."),
    Check("W=2: three steps in a row, nothing stale from the step before", 2, 2,
          partial(overlap_case, props=ALL, widths=W, plan=PLAN, steps=3, dtype=f32, seed=56),
          uses=USES, hint=HINT_STEPS),
    Check("hidden: larger world, float64, uneven buckets, two steps", 2, 3,
          partial(overlap_case, props=ALL, widths=BIG, plan=BIG_PLAN, steps=2, dtype=f64, seed=57),
          hidden=True, uses=USES, hint=HINT_STEPS),
    Check("hidden: larger world, one bucket per parameter, three steps", 2, 4,
          partial(overlap_case, props=ALL, widths=W, plan=[[5], [4], [3], [2], [1], [0]], steps=3, dtype=f32,
                  seed=58), hidden=True, uses=USES, hint=HINT_LAUNCH),
    Check("hidden: larger world, a single bucket for the whole model", 1, 4,
          partial(overlap_case, props=ALL, widths=W, plan=[[5, 4, 3, 2, 1, 0]], steps=2, dtype=f32, seed=59),
          hidden=True, uses=USES, hint=HINT_LAUNCH),
)


EXERCISE = Exercise(
    id="04", stem="04_overlap_hook", title="Overlap: all-reduce from backward hooks", names=("OverlapSync",),
    stub=STUB, intro=INTRO, try_code=TRY, checks=CHECKS,
    forbidden=tuple(name for name in TORCH_COLLECTIVES if name != "torch.distributed.all_reduce") + (
        "torch.nn.parallel.DistributedDataParallel", "dpteach.sync.overlap.OverlapSync"),
    forbidden_methods=tuple(m for m in PROCESS_GROUP_METHODS if m != "allreduce"),
    rule="this exercise asks you to build the overlap yourself with dist.all_reduce, and your code uses "
         "another collective or a ready-made synchroniser",
    after="Exercise 05 adds gradient accumulation: when *not* to synchronise.",
)
