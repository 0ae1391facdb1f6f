"""Exercise 05: gradient accumulation - no_sync() decided before forward, the loss divided by K.

The learner writes ``train_step(model, micro_batches, optimizer, loss_fn)`` for a real
``DistributedDataParallel`` model. Two mistakes are common and they show up differently:

* **forgetting to divide the loss by K** changes the numbers: the weights no longer match one process
  training on the whole global batch (computed independently on every rank, float64, from the same
  seed) - the "weights" checks;
* **deciding to skip the sync after forward** does *not* change the numbers (DDP's reducer was armed
  by the forward, so every micro-batch is all-reduced, and averaging is linear), only the cost. So the
  grader counts the all-reduces DDP performs, through a communication hook it registers: one per
  bucket per step, on the last micro-batch - the "synchronised once" checks, which also hold the weights
  to the right numbers (a count of one proves nothing if that one sync did not average the gradients).

**The count is out of the learner's reach.** DDP keeps the hook where the learner's code can find it
(``model._comm_hooks``), and whatever the hook holds - a closure, a ``partial``'s arguments, its module's
globals - can be read and changed from there. So the hook (:func:`_averaging_hook`) is a plain function of
this module that holds nothing: it asks torch for the world size, and calls ``dist.all_reduce`` as the
grader (the guard tells the grader's calls by their caller: ``grading/guard.py``). Its calls are counted by the
guard's profiler, in a list only the grader's drive holds; its code is sealed (``spec.observes``).

The DDP model lives in the rank only: the rank drives it (``_ddp``, ``_train``, through ``ctx.drive``)
and records what each step left - the hook's count, the returned loss, the gradients, the weights - and
the judging runs on that record, in the rank and again in the replay outside it. Each rank's micro-batches
are drawn from its own secret salt, learned by the others only after the last step (``common.py``).
"""
from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..spec import Check, Exercise, Fail, no_collectives, observes
from .common import everyones, secret_seed

STUB = '''\
import torch


def train_step(model, micro_batches, optimizer, loss_fn):
    """One optimizer step with gradient accumulation on a DistributedDataParallel `model`.

    micro_batches: this rank's K (inputs, targets) pairs for the step. Run forward and backward on
    each. Only the last one may synchronise: the first K-1 run entirely - forward AND backward -
    inside `with model.no_sync():`. Divide each micro-batch's loss by K before backward, so the
    accumulated gradient is the mean. Then step the optimizer and clear the gradients.
    Returns the step's loss on this rank: the mean of the K micro-batch losses, as a float.
    """
    raise NotImplementedError("your code here")
'''

WIDTHS, LR, BATCH = (4, 8, 3), 0.1, 3


def _model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(WIDTHS[0], WIDTHS[1]), nn.Tanh(), nn.Linear(WIDTHS[1], WIDTHS[2])).double()


def _micro_batches(seed, step, rank, k):
    generator = torch.Generator().manual_seed((seed * 1000 + step * 37 + rank) % 2 ** 63)
    return [(torch.randn(BATCH, WIDTHS[0], generator=generator, dtype=torch.float64),
             torch.randn(BATCH, WIDTHS[-1], generator=generator, dtype=torch.float64)) for _ in range(k)]


def _reference(seed, seeds, k, steps):
    """One process, one model, each step on the whole global batch (every rank's micro-batches, drawn from
    ``seeds``, one per rank)."""
    model = _model(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(steps):
        pairs = [pair for r, rank_seed in enumerate(seeds) for pair in _micro_batches(rank_seed, step, r, k)]
        x, y = torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs])
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    return [p.detach() for p in model.parameters()]


def _import_dynamo():
    """Constructing DDP (and a torch optimizer) first imports torch._dynamo, seconds of CPU per rank: pay
    that once, before the checks and their time limits start."""
    import torch._dynamo  # noqa: F401


def accumulation_case(ctx, props, k, steps, seed):
    live = {}  # the DDP model and its optimizer: in the rank only, never in the replay
    ctx.drive(_ddp, live, seed)
    mine_seed = secret_seed(ctx, seed)
    seen = None
    for step in range(steps):
        seen = ctx.drive(_train, live, k, step, mine_seed)
        calls, returned, later = seen["calls"], seen["returned"], f" (step {step + 1} of {steps})" if steps > 1 else ""
        if "comm" in props and calls != 1:
            if calls == 0:
                raise Fail("DDP never synchronised the gradients: the last micro-batch must run outside "
                           "no_sync()" + later)
            raise Fail("DDP synchronised the gradients more than once in the step: every micro-batch but the "
                       "last must run forward and backward inside no_sync() - entered before forward" + later)
        if "loss" in props and step == 0:
            if not isinstance(returned, (float, int)) and not (isinstance(returned, torch.Tensor)
                                                               and returned.numel() == 1):
                raise Fail("train_step should return the step's loss as a float")
            with torch.no_grad():
                first_loss = sum(nn.functional.mse_loss(_model(seed)(x), y).item()
                                 for x, y in _micro_batches(mine_seed, 0, ctx.rank, k)) / k
            if abs(float(returned) - first_loss) > 1e-9 * max(1.0, abs(first_loss)):
                raise Fail("the returned loss is not the mean of the K micro-batch losses (before the update)")
        if "cleared" in props and any(g is not None and g.count_nonzero() > 0 for g in seen["grads"]):
            raise Fail("the gradients were not cleared after the optimizer step: the next step would add to them")
    if "weights" in props:
        expected = _reference(seed, everyones(ctx, mine_seed), k, steps)  # only now: see common.py
        for mine, want in zip(seen["params"], expected):
            if not torch.allclose(mine, want, atol=1e-10, rtol=1e-9):
                raise Fail("the weights differ from one process training on the whole global batch: is each "
                           "loss divided by K, is the optimizer stepped once per step, are gradients cleared?")


@observes
def _averaging_hook(state, bucket):
    """What DDP does by default: average the bucket over the ranks. Holds nothing (see the module's text)."""
    tensor = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(tensor, async_op=True).get_future().then(_first_value)


@observes
def _first_value(done):
    return done.value()[0]


@observes
def _ddp(ctx, live, seed):
    """The DDP model, its optimizer, and the communication hook whose calls the guard counts."""
    model = _model(seed)
    ddp = DistributedDataParallel(model)
    calls = []  # held by this drive and the guard's watch only

    def count(event, frame, arg):
        if event == "call":
            calls.append(1)

    ctx.guard.watch(_averaging_hook, count)
    ctx.hand(_first_value)
    ddp.register_comm_hook(None, ctx.handed(_averaging_hook))  # DDP calls it from the learner's backward
    live.update(params=list(model.parameters()), ddp=ddp, calls=calls,
                optimizer=torch.optim.SGD(ddp.parameters(), lr=LR))


@observes
def _train(ctx, live, k, step, mine_seed):
    """One call of the learner's train_step; what it left: DDP's all-reduces, its result, gradients, weights."""
    live["calls"].clear()
    batches = _micro_batches(mine_seed, step, ctx.rank, k)
    with ctx.running_learner_code():
        returned = ctx.learner("train_step")(live["ddp"], batches, live["optimizer"], nn.functional.mse_loss)
    params = live["params"]
    return {"calls": len(live["calls"]), "returned": returned, "params": [p.detach().clone() for p in params],
            "grads": [None if p.grad is None else p.grad.detach().clone() for p in params]}


HINT_WEIGHTS = ("The accumulated gradient must be the mean over the K micro-batches and the W ranks: DDP "
                "averages over ranks, the division of each loss by K averages over micro-batches.")
HINT_SYNC = ("The choice has to be made before model(x) is called: pick the context for the micro-batch "
             "(model.no_sync() or contextlib.nullcontext()) first, then run forward and backward inside it.")

CHECKS = (
    Check("W=2, K=2: the weights after one step equal one process on the whole batch", 2, 2,
          partial(accumulation_case, props=("weights",), k=2, steps=1, seed=61), hint=HINT_WEIGHTS),
    Check("W=2, K=4: gradients are synchronised once per step, on the last micro-batch", 2, 2,
          partial(accumulation_case, props=("comm", "weights"), k=4, steps=1, seed=62), hint=HINT_SYNC),
    Check("W=2, K=2: returns the step's loss, the mean of the micro-batch losses", 1, 2,
          partial(accumulation_case, props=("loss",), k=2, steps=1, seed=63),
          hint="Add up loss.item() of each scaled micro-batch loss (or average the unscaled ones)."),
    Check("W=2, K=2: three steps in a row match one process, gradients cleared", 2, 2,
          partial(accumulation_case, props=("weights", "cleared"), k=2, steps=3, seed=64),
          hint=HINT_WEIGHTS),
    Check("larger world, more micro-batches, two steps", 2, 3,
          partial(accumulation_case, props=("weights", "comm", "cleared"), k=3, steps=2, seed=65), hidden=True, hint=HINT_WEIGHTS),
    Check("larger world, no accumulation (K=1) still synchronises", 1, 3,
          partial(accumulation_case, props=("weights", "comm"), k=1, steps=1, seed=66), hidden=True,
          hint=HINT_SYNC),
    Check("a world of one rank, synchronised once in each of several steps", 2, 1,
          partial(accumulation_case, props=("weights", "comm", "loss"), k=3, steps=3, seed=67), hidden=True, hint=HINT_SYNC),
)


EXERCISE = Exercise(
    id="05", stem="05_accumulation", title="Gradient accumulation with no_sync()", names=("train_step",),
    stub=STUB, checks=CHECKS,
    **no_collectives("dpteach.training.train.train_on_rank", "dpteach.training.train.train_each_on_rank",
                     "dpteach.training.train.train_interleaved_on_rank", "dpteach.training.train.SyncTrainer",
                     "dpteach.training.reference.train_single_process"),
    rule="this exercise asks DDP to do the communication, and your code calls a collective itself",
    warmup=_import_dynamo,
)
