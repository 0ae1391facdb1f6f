"""Lesson 02: a collective that the ranks do not agree on, with and without torch's checks.

A collective carries no name or tag. The n-th collective call of one rank meets the n-th call of
every other rank, and the library trusts that they agree on the operation, the shape and the
dtype. When they do not - a rank skipped a step, a tensor was padded on one rank only - nothing
in the call itself says so, and what happens next depends on the backend:

* gloo notices only when bytes arrive that do not fit the receive buffer. In this torch it then
  aborts the whole process (a C++ ``gloo::EnforceNotMet``: "Received data size doesn't match
  expected size. Is there a distributed collective mismatch in your code?"), so the rank dies
  with SIGABRT and no Python traceback; the launcher reports the signal and the rank's last lines;
* NCCL takes one count and one datatype per call and does not exchange them between ranks
  before moving data: a mismatch can hang until the timeout, or finish with wrong data;
* with ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, read when the process group is created, torch wraps
  every process group in a ``ProcessGroupWrapper`` that first exchanges a fingerprint of each
  collective (sequence number, op, shapes, dtypes, devices) over a helper gloo group, and every
  rank raises a ``RuntimeError`` naming both ranks' calls before any data moves
  (torch/csrc/distributed/c10d/ProcessGroupWrapper.cpp; the torch.distributed docs, "Debugging
  torch.distributed applications"). The price is that extra exchange on every collective, which
  is why it is a debugging setting.

:func:`collective_mismatch` runs the same mismatched all-reduce under each setting and reports
what the ranks saw: it finished, a rank raised, a rank died, or the world timed out.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from .. import validate

from ..ranks import context
from ..ranks.launcher import RankError, launch
from ..ranks.world import World, resolve_world

DEBUG_LEVELS = ("OFF", "INFO", "DETAIL")


def _mismatched_all_reduce(base_numel: int) -> list[float]:
    """Rank r all-reduces ``base_numel + 2r`` elements: every rank believes it is the same call."""
    tensor = torch.ones(base_numel + 2 * dist.get_rank(), device=context.device())
    dist.all_reduce(tensor)
    return tensor.cpu().tolist()


def _first_line_with(lines, words=("mismatch", "doesn't match", "Detected")) -> str:
    """The most telling line of a rank's output or message: one that names the mismatch, else the last."""
    lines = [line.strip() for line in lines if line.strip()]
    return next((line for line in lines if any(w in line for w in words)), lines[-1] if lines else "")


def _attempt(world: World, level: str, base_numel: int, timeout: float) -> dict:
    start = time.perf_counter()
    row = {"debug": level, "outcome": "finished", "rank": None, "exit_code": None, "message": "",
           "results": None}
    try:
        row["results"] = launch(_mismatched_all_reduce, world, args=(base_numel,), timeout=timeout,
                                show_output=False, progress=False, env={"TORCH_DISTRIBUTED_DEBUG": level})
    except RankError as err:
        row.update(rank=err.rank, exit_code=err.exit_code)
        if err.exc_type is None:  # died without a Python exception: a signal or a native abort
            row.update(outcome="crashed", message=_first_line_with(err.last_output))
        else:
            first = str(err).splitlines()[0].split("raised ", 1)[-1]  # "RuntimeError: Detected mismatch ..."
            row.update(outcome="raised", message=first.removesuffix("; the other ranks were stopped"))
    except TimeoutError as err:
        row.update(outcome="timed_out", message=str(err))
    row["seconds"] = time.perf_counter() - start
    return row


def collective_mismatch(world_size: int | World | None = 2, debug_levels=("OFF", "DETAIL"), base_numel: int = 4,
                        timeout: float = 30.0, backend: str = "auto", device: str = "auto") -> dict:
    """Run an all-reduce whose size differs between ranks once per ``TORCH_DISTRIBUTED_DEBUG`` level.

    Returns ``{"world_size", "backend", "device", "numel_per_rank": [...], "rows": [{"debug",
    "outcome" ("finished" | "raised" | "crashed" | "timed_out"), "rank" (the rank reported first),
    "exit_code", "message" (the line that explains it), "results" (only if it finished), "seconds"}]}``.
    """
    world = resolve_world(world_size, backend, device)
    levels = tuple(validate.choices("debug_levels", debug_levels, DEBUG_LEVELS))
    validate.integer("base_numel", base_numel, low=1)
    rows = [_attempt(world, level, base_numel, timeout) for level in levels]
    return {"world_size": world.size, "backend": world.backend, "device": world.device_type,
            "numel_per_rank": [base_numel + 2 * r for r in range(world.size)], "rows": rows}
