"""Run a function on W ranks of a real ``torch.distributed`` world and get their results back.

    >>> import dpteach, torch, torch.distributed as dist
    >>> def total(x):
    ...     t = torch.tensor([x + dist.get_rank()])
    ...     dist.all_reduce(t)
    ...     return t.item()
    >>> dpteach.launch(total, world_size=4, args=(10,))
    [46, 46, 46, 46]

Why not ``torch.multiprocessing.spawn``? It pickles the function *by reference*, so a function
defined in a notebook cell cannot be found by the children, and a script without an
``if __name__ == "__main__"`` guard runs again in every child. Here the function travels by value
(cloudpickle) to processes that never ran the caller's code - children of a helper that has imported torch
once (``zygote.py``), or on GPUs fresh interpreters (``python -m dpteach.ranks.worker``) - and nothing is
re-executed.

What the launcher promises, because a course that hangs teaches nothing:

* a free port every time: the launcher opens the rendezvous store on port 0 and the OS picks,
  so two launches in a row, or two notebooks at once, never collide;
* no hang: after ``timeout`` seconds the ranks still running are killed and a ``TimeoutError``
  names them;
* no stray processes: every rank leads its own process group, which is killed on error, timeout
  or Ctrl-C / notebook interrupt; a rank whose launcher vanished exits by itself;
* errors come home: a rank that raises (or dies) becomes a :class:`RankError` carrying the rank,
  its exit code and its traceback, and the other ranks are stopped;
* a world that fails to form - a rank that cannot connect to its peers, before the function runs -
  is started once more with a fresh store, and a second failure is reported (under heavy load,
  gloo's connect on localhost occasionally fails; an exception raised by the function is never retried);
* output is shown, each line prefixed with its rank, in the notebook cell or terminal;
* under ``torchrun`` (``RANK`` and ``WORLD_SIZE`` set) no process is spawned: the caller already is
  a rank, so the function runs in that world and every rank gets the list of all results.
"""
from __future__ import annotations

import os

import cloudpickle

from .. import validate
from .memory import check_memory_for_ranks
from .processes import RankError, RankProcesses
from .torchrun import run_in_torchrun_world, under_torchrun
from .world import World, resolve_world

__all__ = ["DEFAULT_TIMEOUT", "RankError", "launch", "launch_in"]

DEFAULT_TIMEOUT = 300.0


def launch(fn, world_size: int | World | None, args=(), kwargs=None, backend: str = "auto", device: str = "auto",
           timeout: float = DEFAULT_TIMEOUT, show_output: bool = True, progress: bool = True,
           env: dict | None = None) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks; return the ranks' results (index = rank).

    world_size: the number of ranks; None means torchrun's world, or ``dpteach.default_world_size()``;
             or a :class:`dpteach.ranks.world.World` resolved before (then backend and device stay "auto").
    backend: ``"auto"`` (NCCL when every rank can have its own GPU, else gloo), ``"gloo"`` or ``"nccl"``.
    device:  ``"auto"``, ``"cpu"`` or ``"cuda"`` - where gloo ranks compute (``dpteach.device()`` in the rank).
    timeout: seconds before unfinished ranks are killed and ``TimeoutError`` is raised.
    env:     extra environment variables for the ranks, set before they import torch (for settings
             read at start-up, such as ``TORCH_DISTRIBUTED_DEBUG``). Under torchrun the ranks already
             run: there the variables must already be set, or a ``ValueError`` says so.
    """
    # What the caller resolved, or torchrun's world: bad arguments fail here, before any process or rendezvous.
    world = resolve_world(world_size, backend, device, emulated_peers_ok=not under_torchrun())
    return launch_in(world, fn, args, kwargs, timeout, show_output, progress, env)


def launch_in(world: World, fn, args=(), kwargs=None, timeout: float = DEFAULT_TIMEOUT, show_output: bool = True,
              progress: bool = True, env: dict | None = None) -> list:
    """:func:`launch` in a world resolved before (``dpteach.training.prologue`` resolves each experiment's
    world once, and it is not resolved again on the way down)."""
    if not callable(fn):
        raise TypeError(f"fn={fn!r} is not callable: pass the function each rank should run")
    kwargs = {} if kwargs is None else dict(kwargs)
    validate.number("timeout", timeout, above=0, unit="a number of seconds")
    env = {} if env is None else env
    if not isinstance(env, dict) or not all(isinstance(k, str) and k and isinstance(v, str) for k, v in env.items()):
        raise ValueError(f"env={env!r} is not allowed: give a dict of variable names to string values")
    torchrun = under_torchrun()
    if torchrun and any(os.environ.get(k) != v for k, v in env.items()):
        raise ValueError(f"env={env!r} cannot be applied under torchrun: its ranks are already running; "
                         f"set these variables in the environment torchrun starts from")
    if not torchrun and "DPTEACH_PARENT_PID" in os.environ:
        raise RuntimeError("launch() was called inside a rank: ranks cannot start worlds of their own")
    if torchrun:
        return run_in_torchrun_world(fn, world, args, kwargs, timeout)
    check_memory_for_ranks(world.size)  # a container over its limit kills the notebook's kernel, not a rank
    try:
        payload = cloudpickle.dumps((fn, tuple(args), kwargs))
    except Exception as exc:
        raise TypeError(f"fn or its arguments cannot be sent to the ranks ({exc}); define the function "
                        f"at top level or pass plain data") from exc
    try:
        return RankProcesses(world, payload, timeout, show_output, progress, env).run()
    except RankError as err:
        if not err.while_joining:
            raise
        # The world never formed (a rank failed to connect, before fn ran): under heavy load gloo's full-mesh
        # connect on localhost now and then fails so ("Connection closed by peer" from connectFullMesh). One
        # fresh world - new store, new ports - is cheap and almost always forms; a second failure is reported.
        if show_output:
            print(f"[dpteach] the ranks could not form a world ({err.exc_type}); starting them once more",
                  flush=True)
        return RankProcesses(world, payload, timeout, show_output, progress, env).run()
