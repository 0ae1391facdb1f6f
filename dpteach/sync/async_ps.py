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

``max_staleness`` bounds it (in the spirit of stale-synchronous parallel, Ho et al. 2013): a push
staler than the bound is dropped and the worker gets fresh weights to try again.

To keep the step size comparable with synchronous training, each push is scaled by 1/(W-1):
one round of W-1 pushes then moves the weights about as far as one synchronous step.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.nn.utils import parameters_to_vector, vector_to_parameters


def serve(model, optimizer, pushes: int, max_staleness: int | None, timeline) -> dict:
    """Rank 0: apply ``pushes`` gradients from any worker, in arrival order."""
    params = [p for p in model.parameters() if p.requires_grad]
    n = sum(p.numel() for p in params)
    inbox = torch.empty(n + 1)  # [version the worker used, gradient...]
    version, applied, dropped, staleness = 0, 0, 0, []
    workers = dist.get_world_size() - 1
    for _ in range(pushes):
        sender = dist.recv(inbox)  # from whichever worker is first
        start = timeline.now()
        stale = version - int(inbox[0].item())
        staleness.append({"worker": sender, "staleness": stale, "server_version": version})
        if max_staleness is not None and stale > max_staleness:
            dropped += 1
        else:
            grad = inbox[1:] / workers
            offset = 0
            for p in params:
                p.grad = grad[offset:offset + p.numel()].view_as(p).clone()
                offset += p.numel()
            optimizer.step()
            version += 1
            applied += 1
        reply = torch.cat([torch.tensor([float(version)]), parameters_to_vector(params).detach()])
        dist.send(reply, sender)
        timeline.add(version, "optimizer", start, timeline.now(), worker=sender)
    return {"applied": applied, "dropped": dropped, "staleness": staleness, "version": version}


def work(model, compute_gradient, updates: int, slow_ms: float, timeline) -> dict:
    """A worker: ``updates`` times, compute a gradient, push it, pull fresh weights."""
    params = [p for p in model.parameters() if p.requires_grad]
    version, step_times, wire_bytes = 0, [], 0
    for update in range(updates):
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
        timeline.add(update, "comm", comm_start, timeline.now(), lane="comm")
        version = int(reply[0].item())
        vector_to_parameters(reply[1:].to(params[0].device), params)
        for p in params:
            p.grad = None
        wire_bytes += message.numel() * 4
        step_times.append(time.perf_counter() - start)
    return {"step_times": step_times, "wire_bytes": wire_bytes / max(1, updates), "version": version}
