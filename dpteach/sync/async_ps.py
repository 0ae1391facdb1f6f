"""``async``: a parameter server that applies each worker's gradient the moment it arrives.

Rank 0 is the server: it owns the weights and the optimizer. Ranks 1..W-1 are workers. Each
worker loops, with no barrier and no waiting for the others::

    compute a gradient on the weights it has  ->  push it (with the version it used)
    pull the newest weights back              ->  repeat

The server handles pushes in whatever order they come (``recv`` from any source), applies each
one (``version += 1``) and answers with the current weights. Nobody waits for the slowest
worker - but a worker's gradient was computed on weights that other workers may have updated
since: its *staleness* is ``server version at apply time - version it computed on``. With W-1
workers staleness is typically around W-2, and a slow worker's pushes are the stalest of all
(Dean et al., "Large Scale Distributed Deep Networks", 2012). Stale gradients point downhill from
where the weights *were*, which hurts convergence and makes runs irreproducible: the order of
updates depends on timing.

``max_staleness`` caps it by **dropping** stale pushes: a push staler than the cap is discarded and
the worker gets fresh weights to try again. This is a policy of its own, not stale-synchronous
parallel: in SSP (Ho et al., NeurIPS 2013) a worker that gets more than s clocks ahead of the
slowest one *waits* for it, and no update is ever dropped. Dropping keeps the fast workers busy and
every applied gradient fresh, at the price of discarding the slow worker's work.

The server receives from whichever worker sends first (``recv`` without a source). gloo supports
that; NCCL's point-to-point calls need the peer's rank, so this strategy runs on CPU ranks only.

To keep the step size comparable with synchronous training, each push is scaled by 1/(W-1):
one round of W-1 pushes then moves the weights about as far as one synchronous step.

The run lasts a fixed number of pushes, ``steps x (W-1)``, from whoever sends them: a fast worker
pushes more often than a slow one, as in a real parameter server. When the budget is spent, each
worker's next push is answered with "stop" (version -1) instead of weights.

Bytes: a worker sends its gradient (n floats) per update and receives the weights (n floats).
The server's link carries both directions for *every* worker - the bottleneck that pushed the
field towards all-reduce.
"""
from __future__ import annotations

import time
from itertools import islice

import torch
import torch.distributed as dist
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from ..network.comm import Comm
from ..ranks import context
from ..replica.data import sample_batch, split_for_rank
from ..replica.build import (build_replica, flat_weights, forward_backward, make_optimizer, replica_spread, step_batches,
                       summarise)
from ..replica.timeline import Timeline, start_together
from .base import Strategy
from .knobs import Knob


class ParameterServer(Strategy):
    """The strategy as the trainer sees it: rank 0 serves, ranks 1..W-1 work, with no step in common.

    It is not in lockstep, so it brings its own loop (:meth:`train_on_rank`) instead of the
    per-step calls of ``train.SyncTrainer``; its point-to-point messages are not emulated on a link.
    """

    name = "async"
    exact = False
    lockstep = False
    servers = 1
    emulates_link = False
    emulates_peers = False
    knobs = (Knob("max_staleness", None, "drop a push staler than this many versions (default None: apply every "
                                         "push)", low=0, none_ok=True),)

    @classmethod
    def check(cls, config, world_size: int) -> None:
        if world_size < 2:
            raise ValueError(f"strategy='async' with world_size={world_size} is not allowed: rank 0 is the "
                             f"parameter server, so at least one more rank must be a worker")
        super().check(config, world_size)

    @classmethod
    def train_on_rank(cls, config) -> dict:
        """Serve (rank 0) or work (the others) for ``config.steps x (W-1)`` pushes; the summary reports
        the server's weights, and the loss of those weights on the last global batch."""
        model, dataset, criterion = build_replica(config)
        timeline = Timeline(context.device())
        comm = Comm(None, timeline=timeline)  # point to point, counted and drawn where it is sent
        rank, device = comm.rank, context.device()
        workers = cls.workers(comm.size)
        optimizer = make_optimizer(config, model.parameters())
        batches = list(islice(step_batches(config, dataset, workers), config.steps))
        start_together(timeline)
        started = time.perf_counter()
        if rank == 0:
            cap = cls.settings(config.knobs)["max_staleness"]
            server = serve(model, optimizer, config.steps * workers, cap, comm)
            result = {"step_times": [], "bytes_per_push": 0.0}
        else:
            def compute_gradient(update):  # a fast worker may do more updates than steps: wrap around
                batch = batches[update % len(batches)]
                micro = split_for_rank(batch, rank - 1, workers, config.batch_per_rank, config.accum_steps)
                forward_backward(model, criterion, dataset, micro, timeline, update, config.accum_steps)
            slow = config.slow_ms if config.slow_rank == rank else 0.0
            result = work(model, compute_gradient, slow, comm)
            server = None
        context.synchronize()
        timeline.resolve()  # on a GPU the workers' forward and backward spans are CUDA events until now
        dist.barrier()
        workers_spread = replica_spread(flat_weights(model))  # workers hold whatever weights they pulled last
        for p in model.parameters():  # from here on, report the server's weights: the ones that count
            comm.broadcast(p.data, src=0)
        with torch.no_grad():  # no loss is shared per step: the final weights' loss on the last global batch
            x, y = (t.to(device) for t in sample_batch(dataset, batches[-1]))
            losses = [criterion(model(x), y).item()]
        summary = summarise(config, model, losses, result["step_times"], [result["bytes_per_push"]], timeline,
                            average_losses=False)
        return {**summary, "replica_spread": workers_spread, "async": server, "started_at": started}


def serve(model, optimizer, pushes: int, max_staleness: int | None, comm: Comm) -> dict:
    """Rank 0: handle ``pushes`` gradients from any worker, in arrival order, then stop every worker."""
    timeline = comm.timeline
    params = [p for p in model.parameters() if p.requires_grad]
    n = sum(p.numel() for p in params)
    inbox = torch.empty(n + 1)  # [version the worker used, gradient...]
    stop = torch.zeros(n + 1)
    stop[0] = -1.0
    version, applied, dropped, staleness = 0, 0, 0, []
    workers = comm.size - 1
    stopped: set[int] = set()
    while len(stopped) < workers:
        sender = comm.recv(inbox)  # from whichever worker is first
        if applied + dropped >= pushes:  # the run is over: this push is not applied
            comm.send(stop, sender)
            stopped.add(sender)
            continue
        start = timeline.now()
        stale = version - int(inbox[0].item())
        staleness.append({"worker": sender, "staleness": stale, "server_version": version})
        if max_staleness is not None and stale > max_staleness:
            dropped += 1
        else:
            grad = (inbox[1:] / workers).to(params[0].device)  # messages travel on the host (gloo)
            offset = 0
            for p in params:
                p.grad = grad[offset:offset + p.numel()].view_as(p).clone()
                offset += p.numel()
            optimizer.step()
            version += 1
            applied += 1
        reply = torch.cat([torch.tensor([float(version)]), parameters_to_vector(params).detach().cpu()])
        comm.send(reply, sender)
        timeline.add(version, "optimizer", start, timeline.now(), worker=sender)
    return {"applied": applied, "dropped": dropped, "staleness": staleness, "version": version}


def work(model, compute_gradient, slow_ms: float, comm: Comm) -> dict:
    """A worker: compute a gradient, push it, pull fresh weights - until the server says stop."""
    params = [p for p in model.parameters() if p.requires_grad]
    version, step_times, update = 0, [], 0
    while True:
        comm.new_step(update)
        start = time.perf_counter()
        compute_gradient(update)
        if slow_ms:
            time.sleep(slow_ms / 1e3)  # this worker is slower on purpose
        grad = parameters_to_vector([p.grad for p in params])
        message = torch.cat([torch.tensor([float(version)]), grad.detach().cpu()])
        reply = torch.empty_like(message)
        with comm.exchange():  # the push and the pull: the worker computes nothing meanwhile
            comm.send(message, 0)
            comm.recv(reply, 0)
        for p in params:
            p.grad = None
        if reply[0].item() < 0:  # the server's budget of pushes is spent
            break
        version = int(reply[0].item())
        vector_to_parameters(reply[1:].to(params[0].device), params)
        step_times.append(time.perf_counter() - start)
        update += 1
    comm.new_step(update)  # every push, the last one (answered "stop") included, sent the same bytes
    return {"step_times": step_times, "bytes_per_push": comm.total_sent / (update + 1), "version": version,
            "updates": update}
