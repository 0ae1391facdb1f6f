"""What code running *inside* a rank asks about its world: its device, and how to report progress.

The launcher sets a few environment variables in every rank it starts (``DPTEACH_DEVICE``,
``DPTEACH_PROGRESS_*``). Under ``torchrun`` those are absent and the answers are derived from the
torchrun variables instead, so experiment code never needs to know who started it.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from .backend import backend_for

_progress_store = None


def device() -> torch.device:
    """The device this rank computes on (``cpu`` or ``cuda:i``); ``cpu`` outside any world."""
    name = os.environ.get("DPTEACH_DEVICE")
    if name:
        return torch.device(name)
    if dist.is_initialized() and backend_for("cuda") == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def synchronize() -> None:
    """Wait for queued GPU work, so that a host clock read afterwards includes it."""
    if device().type == "cuda":
        torch.cuda.synchronize(device())


def _store():
    global _progress_store
    port = os.environ.get("DPTEACH_PROGRESS_PORT")
    if port is None:
        return None
    if _progress_store is None:
        _progress_store = dist.TCPStore(os.environ.get("MASTER_ADDR", "127.0.0.1"), int(port),
                                        is_master=False)
    return _progress_store


def report_progress(advance: int = 1, total: int | None = None, desc: str | None = None) -> None:
    """Advance the progress bar that the launching process shows (call it from rank 0 only).

    Ranks cannot draw a bar themselves: their output is captured line by line and prefixed
    with the rank. So rank 0 adds to a counter in the launcher's key-value store and the
    launcher draws one bar in the notebook cell or terminal. ``total`` (and ``desc``) set the
    bar's length and label; call once with ``advance=0`` to announce them. A later ``desc`` renames the
    bar while it runs ("batch 64"), so a long run can say which part it is on.
    """
    store = _store()
    if store is None:
        return
    if total is not None:
        store.set("progress/total", str(int(total)))
    if desc is not None:
        store.set("progress/desc", desc)
    if advance:
        store.add("progress/done", int(advance))
