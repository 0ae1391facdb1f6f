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

import torch
import torch.distributed as dist
from torch.nn.utils import parameters_to_vector, vector_to_parameters


def serve(model, optimizer, pushes: int, max_staleness: int | None, timeline) -> dict:
    """Rank 0: handle ``pushes`` gradients from any worker, in arrival order, then stop every worker."""
    params = [p for p in model.parameters() if p.requires_grad]
    n = sum(p.numel() for p in params)
    inbox = torch.empty(n + 1)  # [version the worker used, gradient...]
    stop = torch.zeros(n + 1)
    stop[0] = -1.0
    version, applied, dropped, staleness = 0, 0, 0, []
    workers = dist.get_world_size() - 1
    stopped: set[int] = set()
    while len(stopped) < workers:
        sender = dist.recv(inbox)  # from whichever worker is first
        if applied + dropped >= pushes:  # the run is over: this push is not applied
            dist.send(stop, sender)
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
        dist.send(reply, sender)
        timeline.add(version, "optimizer", start, timeline.now(), worker=sender)
    return {"applied": applied, "dropped": dropped, "staleness": staleness, "version": version}


def work(model, compute_gradient, slow_ms: float, timeline) -> dict:
    """A worker: compute a gradient, push it, pull fresh weights - until the server says stop."""
    params = [p for p in model.parameters() if p.requires_grad]
    version, step_times, wire_bytes, update = 0, [], 0, 0
    while True:
        start = time.perf_counter()
        compute_gradient(update)
        if slow_ms:
            time.sleep(slow_ms / 1e3)  # this worker is slower on purpose
        grad = parameters_to_vector([p.grad for p in params])
        message = torch.cat([torch.tensor([float(version)]), grad.detach().cpu()])
        comm_start = timeline.now()
        dist.send(message, 0)
        reply = torch.empty_like(message)
        dist.recv(reply, 0)
        for p in params:
            p.grad = None
        if reply[0].item() < 0:  # the server's budget of pushes is spent
            break
        timeline.add(update, "comm", comm_start, timeline.now(), lane="comm")
        version = int(reply[0].item())
        vector_to_parameters(reply[1:].to(params[0].device), params)
        wire_bytes += message.numel() * 4
        step_times.append(time.perf_counter() - start)
        update += 1
    return {"step_times": step_times, "wire_bytes": wire_bytes / max(1, update), "version": version,
            "updates": update}
