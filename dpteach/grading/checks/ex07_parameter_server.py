"""Exercise 07 (stretch): an asynchronous parameter server that drops stale pushes.

Asynchronous training is nondeterministic - which push arrives first depends on timing - so the checks
cannot compare with one fixed answer. They compare with the learner's own history instead: ``serve``
returns its log (which worker, the version it computed on, applied or dropped), and rank 0 *replays*
that log independently - each applied gradient recomputed on the weights of the version the worker
used - and must arrive at exactly the server's final weights. The log itself must be consistent: every
push answered, each worker computing on the version the server last sent it, and a push dropped if and
only if it is staler than the bound. One worker is made slow on purpose so that staleness happens.

Each worker's batches are drawn from its own secret salt, which the server learns only after the run
(``common.py``): the server can only know a worker's gradients from that worker's messages. And they must
be messages: each rank counts the bytes that reached it through the process group (``guard.Traffic``) -
every push's gradient at the server, the weights of every reply at each worker - so pushes and replies
left in files, or in the store, do not count. The learner's ``serve`` and ``work`` get live objects (a
model, an optimizer, a ``compute_gradient``), so the rank drives them (``ctx.drive``) and the judging runs
on what they left, in the rank and again in the replay outside it.
"""
from __future__ import annotations

import time
from functools import partial

import torch
from torch import nn
from torch.nn.utils import parameters_to_vector

from ..spec import Check, Exercise, Fail, no_collectives, observes
from .common import everyones, require_received, secret_seed
from .ex07_server_log import check_versions, checked_log, replay_log

STUB = '''\
import torch
import torch.distributed as dist
from torch.nn.utils import parameters_to_vector, vector_to_parameters


def serve(model, optimizer, pushes, max_staleness):
    """Rank 0, the server. Handle `pushes` messages from the workers, in the order they arrive.

    A push is one float tensor [version the worker computed on, its gradient flattened in
    model.parameters() order]; `dist.recv(buffer)` with no source returns the rank that sent it.
    staleness = the server's version now - the version in the push. If max_staleness is not None and
    the push is staler than that, drop it; otherwise put the gradient into each param.grad, call
    optimizer.step() and add 1 to the version. Either way, answer the sender with
    [the server's version, the parameters flattened]. Start at version 0.
    Return the log: one (worker rank, version in the push, applied: bool) per push, in handling order.
    """
    raise NotImplementedError("your code here")


def work(model, compute_gradient, updates):
    """Ranks 1..W-1, the workers. `updates` times: compute_gradient(i) fills every param.grad; push
    [the version of the weights you hold, the gradient flattened] to rank 0; receive the answer and
    load its parameters into the model (and remember its version). You start with version 0.
    """
    raise NotImplementedError("your code here")
'''

LR, WIDTHS = 0.05, (4, 6, 2)


class PlainSGD:
    """``p -= lr * p.grad``: what torch.optim.SGD does without momentum, without importing torch._dynamo."""

    def __init__(self, params):
        self.params = list(params)

    @torch.no_grad()
    def step(self):
        for p in self.params:
            if p.grad is not None:
                p.sub_(LR * p.grad)

    def zero_grad(self, set_to_none: bool = True):
        for p in self.params:
            p.grad = None


def _model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(WIDTHS[0], WIDTHS[1]), nn.Tanh(), nn.Linear(WIDTHS[1], WIDTHS[2]))


def _batch(seed, worker, update):
    generator = torch.Generator().manual_seed((seed * 1000 + worker * 97 + update) % 2 ** 63)
    return torch.randn(4, WIDTHS[0], generator=generator), torch.randn(4, WIDTHS[-1], generator=generator)


def _gradient(model, seed, worker, update):
    _gradient_on(model, _batch(seed, worker, update))


def _gradient_on(model, batch):
    for p in model.parameters():
        p.grad = None
    x, y = batch
    nn.functional.mse_loss(model(x), y).backward()


@observes
def _compute_gradient(model, batches, slow_s, update):
    """The ``compute_gradient`` a worker is handed: its own batches only - no seed, no context."""
    _gradient_on(model, batches[int(update)])
    if slow_s:
        time.sleep(slow_s)  # one slow worker: its pushes arrive stale


def server_case(ctx, updates, bound, seed, slow_ms=15.0):
    mine_seed = secret_seed(ctx, seed)  # a worker's batches: its own secret until the run is over
    if ctx.rank > 0:
        seen = ctx.drive(_work, updates, seed, mine_seed, slow_ms)
    else:
        seen = ctx.drive(_serve, updates * (ctx.world - 1), bound, seed)
    seeds = everyones(ctx, mine_seed)  # only now: see common.py
    numel = sum(p.numel() for p in _model(seed).parameters())
    if ctx.rank > 0:
        require_received(ctx, seen["received"], updates * numel * 4, "receiving the server's weights after each push")
        return
    pushes = updates * (ctx.world - 1)
    entries = checked_log(seen["log"], pushes, ctx.world, updates)
    check_versions(entries, bound)
    require_received(ctx, seen["received"], pushes * numel * 4, "receiving every push's gradient")
    replayed = replay_log(entries, partial(_model, seed), _gradient, LR, seeds)
    if not torch.allclose(seen["weights"], replayed, atol=1e-6, rtol=1e-5):
        raise Fail("the server's final weights differ from replaying its own log: is each applied gradient "
                   "put into param.grad before optimizer.step(), and does each worker compute on the weights "
                   "the server sent it?")


def _received_since(ctx, before):
    now = ctx.received_bytes()
    return None if now is None or before is None else now - before


@observes
def _serve(ctx, pushes, bound, seed):
    """The learner's serve on rank 0; what it left: its log, its final weights, the bytes it received."""
    model, before = _model(seed), ctx.received_bytes()
    optimizer = PlainSGD(model.parameters())
    ctx.hand(PlainSGD.step)
    ctx.hand(PlainSGD.zero_grad)
    with ctx.running_learner_code():
        log = ctx.learner("serve")(model, optimizer, pushes, bound)
    return {"log": log, "weights": parameters_to_vector(model.parameters()).detach().clone(),
            "received": _received_since(ctx, before)}


@observes
def _work(ctx, updates, seed, mine_seed, slow_ms):
    """The learner's work on a worker; what it left: the bytes it received."""
    model, before = _model(seed), ctx.received_bytes()
    batches = [_batch(mine_seed, ctx.rank, update) for update in range(updates)]
    slow_s = slow_ms / 1000 if ctx.rank == 1 and ctx.world > 2 else 0.0
    compute_gradient = ctx.handed(partial(_compute_gradient, model, batches, slow_s))  # holds no ctx: H4
    ctx.hand(_compute_gradient)
    with ctx.running_learner_code():
        ctx.learner("work")(model, compute_gradient, updates)
    return {"received": _received_since(ctx, before)}


HINT = ("Keep the server's version as a counter: staleness is counter - the version in the push. Reply to "
        "every push, applied or not; the worker then uses the version and the weights of that reply.")
HINT_REPLAY = ("After recv, copy message[1:] into each param.grad (in model.parameters() order) before "
               "optimizer.step(); a worker loads message[1:] of the reply into its parameters "
               "(vector_to_parameters).")

CHECKS = (
    Check("W=2 (one worker): every push is applied, and the weights follow its log", 1, 2,
          partial(server_case, updates=4, bound=None, seed=101), hint=HINT_REPLAY),
    Check("W=3, no bound, a slow worker: the final weights equal replaying the log", 3, 3,
          partial(server_case, updates=4, bound=None, seed=102), hint=HINT_REPLAY),
    Check("W=3, max_staleness=0: stale pushes dropped, fresh ones applied", 2, 3,
          partial(server_case, updates=4, bound=0, seed=103), hint=HINT),
    Check("larger world, bound 1, more updates", 2, 4,
          partial(server_case, updates=5, bound=1, seed=104), hidden=True, hint=HINT),
    Check("larger world, no bound", 1, 4,
          partial(server_case, updates=3, bound=None, seed=105), hidden=True, hint=HINT_REPLAY),
)


EXERCISE = Exercise(
    id="07", stem="07_parameter_server", title="Asynchronous parameter server with bounded staleness (stretch)",
    names=("serve", "work"), stub=STUB, checks=CHECKS,
    **no_collectives("dpteach.sync.async_ps.serve", "dpteach.sync.async_ps.work"),
    rule="this exercise asks for point-to-point messages, and your code uses a collective or dpteach's own server",
)
