"""``launch`` inside a world that ``torchrun`` started: join it, run, leave it cleanly.

Under torchrun (``RANK`` and ``WORLD_SIZE`` set) every process already is a rank, so ``launch``
spawns nothing: it joins torchrun's world (once), runs the function here, and gives every rank the
list of all ranks' results, exactly as a spawned world would. The same notebook code and the same
``dpteach`` commands therefore run on one laptop, one node with several GPUs, or many nodes.
"""
from __future__ import annotations

import atexit
import os

import torch.distributed as dist

from .backend import open_nccl_communicator, resolve_world, use_device


def run_in_torchrun_world(fn, world_size, args, kwargs, backend, device) -> list:
    """Run ``fn`` on this rank of torchrun's world; return every rank's result, in rank order."""
    env_world, placement = resolve_world(world_size, backend, device)
    if not dist.is_initialized():
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        os.environ.setdefault("DPTEACH_DEVICE", placement.device_for(local_rank))
        use_device(os.environ["DPTEACH_DEVICE"])
        dist.init_process_group(placement.process_group_backend)
        open_nccl_communicator(os.environ["DPTEACH_DEVICE"])
        atexit.register(leave_torchrun_world)
    try:
        value = fn(*args, **kwargs)
    except BaseException:
        _TORCHRUN_STATE["failed"] = True
        raise
    results = [None] * env_world
    dist.all_gather_object(results, value)
    return results


_TORCHRUN_STATE = {"failed": False}


def leave_torchrun_world() -> None:
    """Leave the torchrun world that ``launch`` joined: every rank together, then tear it down.

    A rank that simply exits closes its gloo connections while a peer may still be finishing its
    own last call; gloo then aborts that peer (SIGABRT) and torchrun reports a failure although
    every rank succeeded. A barrier first makes all ranks leave at once. After a failure the
    barrier is skipped: the peers may be waiting in another call, and torchrun stops them anyway.
    """
    if dist.is_available() and dist.is_initialized():
        if not _TORCHRUN_STATE["failed"]:
            dist.barrier()
        dist.destroy_process_group()
