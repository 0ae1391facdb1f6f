"""``launch`` inside a world that ``torchrun`` started: agree, join, run, and leave - or fail fast.

Under torchrun (``RANK`` and ``WORLD_SIZE`` set) every process already is a rank, so ``launch``
spawns nothing: it joins torchrun's world (once), runs the function here, and gives every rank the
list of all ranks' results, exactly as a spawned world would. The same notebook code and the same
``dpteach`` commands therefore run on one laptop, one node with several GPUs, or many nodes.

Three things make a torchrun world safe on real clusters:

1. **One backend for every rank.** Each rank can only see its own node: a node with 8 GPUs for 8
   local ranks would choose NCCL, a node with 4 GPUs for 8 local ranks gloo, and a world whose
   ranks initialise different backends hangs or crashes in its first collective. So before anyone
   initialises, every rank posts what its node allows to the rendezvous store that torchrun already
   runs, reads everyone's, and all make the same decision from the same table: NCCL only if every
   node can, else gloo everywhere (with ``backend="auto"``), or one clear error on every rank (when
   a rank cannot do what was asked, e.g. ``backend="nccl"`` on a node without enough GPUs).
2. **A timeout.** ``init_process_group`` gets ``launch``'s ``timeout``; without one, a
   ``"cpu:gloo,cuda:nccl"`` world waits 30 minutes for a missing peer.
3. **A failing rank leaves at once.** After an exception - in the function, in the command around
   it, anywhere - the rank must not wait in an exit barrier or in ``destroy_process_group`` (which
   can wait forever for NCCL work that a dead peer will never finish). It prints its error and
   exits with status 1; torchrun then stops the other ranks and ends the job.
"""
from __future__ import annotations

import atexit
import json
import os
import socket
import sys
from datetime import timedelta

import torch.distributed as dist

from .backend import backend_in, choose_placement, open_nccl_communicator, use_device

_STATE = {"joined": False, "failed": False, "hook": None}


def under_torchrun() -> bool:
    """True when this process is one rank of a world started by torchrun (or a SLURM recipe)."""
    return ("RANK" in os.environ and "WORLD_SIZE" in os.environ
            and "DPTEACH_PARENT_PID" not in os.environ)


def torchrun_sizes(world_size: int | None) -> tuple[int, int]:
    """torchrun's ``WORLD_SIZE`` and the ranks on this node (``LOCAL_WORLD_SIZE``), after checking that
    ``world_size`` (None or a number) agrees with it."""
    world = int(os.environ["WORLD_SIZE"])
    if world_size is not None and world_size != world:
        raise ValueError(f"world_size={world_size!r} does not match torchrun's WORLD_SIZE={world}: "
                         f"pass world_size={world} (or None) when running under torchrun")
    return world, int(os.environ.get("LOCAL_WORLD_SIZE", world))


def run_in_torchrun_world(fn, world, args, kwargs, timeout: float) -> list:
    """Run ``fn`` on this rank of torchrun's world; return every rank's result, in rank order.

    ``world`` is torchrun's world as ``dpteach.ranks.world.resolve_world`` resolved it (its size checked against
    ``WORLD_SIZE``); its *asked* backend and device are what this node proposes to the others.
    """
    backend, device = world.asked
    if dist.is_initialized():  # joined before: by an earlier launch, or by the user's own code
        check_joined(backend, device)
    else:
        join_torchrun_world(backend, device, timeout)
    try:
        value = fn(*args, **kwargs)
        results = [None] * world.size
        dist.all_gather_object(results, value)
    except BaseException:
        mark_failed()
        raise
    return results


def join_torchrun_world(backend: str, device: str, timeout: float) -> None:
    """Agree on one placement with every other rank, then initialise the world with it."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    wait = timedelta(seconds=timeout)
    _arm_failure_exit()
    # torch's own env:// rendezvous: a client of the store torchrun's agent runs (or, without the
    # agent's store, the one rank 0 hosts), as init_process_group would have opened it.
    store, _, _ = next(dist.rendezvous("env://", rank, world, timeout=wait))
    store.set_timeout(wait)
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    agreed = agree_on_placement(dist.PrefixStore(f"dpteach/{restart}/placement", store), rank, world,
                                propose_placement(local_world, backend, device))
    placement = choose_placement(local_world, agreed["backend"], device)
    if rank == 0 and agreed.get("note"):
        print(f"[dpteach] {agreed['note']}", file=sys.stderr, flush=True)
    os.environ.setdefault("DPTEACH_DEVICE", placement.device_for(local_rank))
    use_device(os.environ["DPTEACH_DEVICE"])
    dist.init_process_group(placement.process_group_backend, store=dist.PrefixStore(f"dpteach/{restart}/pg", store),
                            rank=rank, world_size=world, timeout=wait)
    _STATE["joined"] = True
    atexit.register(leave_torchrun_world)
    open_nccl_communicator(os.environ["DPTEACH_DEVICE"])


def propose_placement(local_world: int, backend: str, device: str) -> dict:
    """What this rank's node allows: a placement, or the error that explains why it has none."""
    where = {"host": socket.gethostname(), "local_ranks": local_world}
    try:
        placement = choose_placement(local_world, backend, device)
    except ValueError as exc:
        return {**where, "error": str(exc)}
    return {**where, "backend": placement.backend, "device": placement.device_type, "gpus": placement.gpus}


def agree_on_placement(store, rank: int, world: int, mine: dict) -> dict:
    """Post this rank's proposal, read every rank's, and return the one decision they all reach.

    Every rank decides from the same table with the same rule, so they agree without a leader:
    an error anywhere is everyone's error (naming the rank and its node); otherwise NCCL if every
    rank proposed it, else gloo (the backend every node has), with a note saying why.
    """
    store.set(str(rank), json.dumps(mine))
    keys = [str(r) for r in range(world)]
    store.wait(keys)
    return decide_placement([json.loads(value) for value in store.multi_get(keys)])


def decide_placement(proposals: list[dict]) -> dict:
    """The rule of :func:`agree_on_placement`, on the list of every rank's proposal (index = rank)."""
    failed = [(r, p) for r, p in enumerate(proposals) if "error" in p]
    if failed:
        rank, p = failed[0]
        others = f" (and {len(failed) - 1} other rank(s))" if len(failed) > 1 else ""
        raise ValueError(f"rank {rank} on {p['host']}{others} cannot join this world: {p['error']}")
    backends = {p["backend"] for p in proposals}
    if backends == {"nccl"}:
        return {"backend": "nccl"}
    if backends == {"gloo"}:
        return {"backend": "gloo"}
    short = sorted({(p["host"], p["local_ranks"], p["gpus"]) for p in proposals if p["backend"] == "gloo"})
    listing = ", ".join(f"{host} ({gpus} GPU(s) for {ranks} ranks)" for host, ranks, gpus in short)
    return {"backend": "gloo",
            "note": f"every rank uses gloo: NCCL needs one GPU per local rank and {listing} cannot give that; "
                    f"start one rank per GPU on every node (torchrun --nproc-per-node) for NCCL"}


def check_joined(backend: str, device: str) -> None:
    """When this process has joined a world already, refuse a backend or device that world does not have."""
    if dist.is_initialized():
        from .context import device as rank_device
        check_joined_world(dist.get_backend_config(), backend, device, rank_device().type)


def check_joined_world(config: str, backend: str, device: str, world_device: str) -> None:
    """A world joined before this ``launch``: say clearly when it cannot serve the course or this call.

    ``config`` is the world's ``dist.get_backend_config()``, e.g. ``"cpu:gloo,cuda:nccl"``, and
    ``world_device`` the type of device this rank computes on ("cpu" or "cuda"). A world
    initialised with ``"nccl"`` alone reads ``"cuda:nccl"`` and cannot move the CPU tensors that the
    course's small collectives use (torch would fail later with "No backend type associated with
    device type cpu").
    """
    if backend_in(config, "cpu") is None:
        raise ValueError(f"this world was initialised with a backend for CUDA tensors only ({config!r}), which "
                         f"cannot move CPU tensors, and the course runs small collectives on CPU tensors too: "
                         f"initialise it with init_process_group('cpu:gloo,cuda:nccl'), or let dpteach.launch "
                         f"join torchrun's world itself")
    world_backend = backend_in(config, "cuda") or backend_in(config, "cpu")
    if backend not in ("auto", world_backend):
        raise ValueError(f"backend={backend!r} differs from the world this process already joined, which moves "
                         f"its tensors with {world_backend!r}: pass backend='auto' or {world_backend!r}")
    if device not in ("auto", world_device):
        raise ValueError(f"device={device!r} differs from the world this process already joined, whose ranks "
                         f"compute on {world_device!r}: pass device='auto' or {world_device!r}")


def in_torchrun_world() -> bool:
    """True once ``launch`` has joined torchrun's world in this process (and not yet left it)."""
    return _STATE["joined"]


def mark_failed() -> None:
    """Record that this rank failed: on exit it then leaves at once, without the parting barrier."""
    _STATE["failed"] = True


def _arm_failure_exit() -> None:
    """Count an exception that nothing caught - raised anywhere, not only in ``fn`` - as a failure."""
    if _STATE["hook"] is not None:
        return
    previous = sys.excepthook

    def hook(kind, value, tb):
        mark_failed()
        previous(kind, value, tb)
    _STATE["hook"] = hook
    sys.excepthook = hook


def leave_torchrun_world() -> None:
    """Leave the torchrun world that ``launch`` joined: every rank together - or, after a failure, alone and now.

    On success a barrier first makes all ranks leave at once: a rank that simply exits closes its
    gloo connections while a peer may still be finishing its own last call, and gloo then aborts
    that peer (SIGABRT). After a failure the peers may be waiting in another call that will never
    complete, and ``destroy_process_group`` can wait on in-flight NCCL work forever: the rank exits
    with status 1 at once (its error is already printed) and torchrun stops the others.
    """
    if not _STATE["joined"]:
        return
    _STATE["joined"] = False
    if _STATE["failed"]:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
