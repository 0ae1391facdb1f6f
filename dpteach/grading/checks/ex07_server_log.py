"""Exercise 07's judging of the server's log (``ex07_parameter_server.py`` holds the exercise and its checks):
the log must be consistent - every push answered once, each worker computing on the version the server last
sent it, a push dropped exactly when it is too stale - and replaying it, every applied gradient recomputed
on the weights of the version its worker used, must end on the server's own final weights.
"""
from __future__ import annotations

import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from ..spec import Fail


def checked_log(log, pushes, world, updates):
    if not isinstance(log, (list, tuple)):
        raise Fail("serve should return its log: a list of (worker rank, version, applied) tuples")
    entries = []
    for entry in log:
        if not isinstance(entry, (list, tuple)) or len(entry) != 3:
            raise Fail("each log entry should be a tuple (worker rank, version in the push, applied)")
        worker, version, applied = entry
        if isinstance(worker, torch.Tensor):
            worker = worker.item()
        if isinstance(version, torch.Tensor) or isinstance(version, float):
            version = float(version)
            if version != int(version):
                raise Fail("a version in the log is not a whole number")
        entries.append((int(worker), int(version), bool(applied)))
    if len(entries) != pushes:
        raise Fail("the log should have one entry per push: every push handled (and answered) exactly once")
    counts = [sum(1 for w, _, _ in entries if w == r) for r in range(world)]
    if counts[0] != 0 or any(c != updates for c in counts[1:]):
        raise Fail("the log does not show every worker pushing `updates` times (rank 0 is the server)")
    return entries


def check_versions(entries, bound):
    version, last_sent = 0, {}
    for worker, used, applied in entries:
        if used != last_sent.get(worker, 0):
            raise Fail("a worker pushed a gradient with a version other than the one the server last sent it")
        stale = version - used
        if stale < 0:
            raise Fail("a push carries a version the server has not reached yet")
        should_apply = bound is None or stale <= bound
        if applied and not should_apply:
            raise Fail("a push staler than max_staleness was applied: drop it (and send fresh weights)")
        if should_apply and not applied:
            raise Fail("a push within the staleness bound was dropped")
        version += applied
        last_sent[worker] = version


def replay_log(entries, make_model, gradient, lr, seeds) -> torch.Tensor:
    """The server's weights after applying the log, each gradient taken at the version its worker used
    (``seeds``: each rank's, for its batches)."""
    model = make_model()
    history = [parameters_to_vector(model.parameters()).detach().clone()]
    pushed = {}
    for worker, used, applied in entries:
        update = pushed.get(worker, 0)
        pushed[worker] = update + 1
        if not applied:
            continue
        vector_to_parameters(history[used], model.parameters())
        gradient(model, seeds[worker], worker, update)
        grad = parameters_to_vector([p.grad for p in model.parameters()])
        history.append(history[-1] - lr * grad)
    return history[-1]
