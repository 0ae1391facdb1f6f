"""The world a command runs in - how many ranks, and where they compute - resolved once.

A learner writes ``world_size=3`` (or nothing); the course turns that into one :class:`World`
value before any process starts, and that value travels whole: an experiment resolves it, hands it
to :func:`dpteach.launch`, and reads its backend and device from it afterwards. Nothing resolves the
same world twice, so the placement the ranks run with is the one the experiment reports::

    world = resolve_world(3)          # on a laptop: 3 rank(s), gloo on cpu
    launch(fn, world)                 # those 3 ranks, with that placement
    resolve_world(world) is world     # True: a resolved world is passed on unchanged

Under ``torchrun`` the world is torchrun's: its ``WORLD_SIZE``, and a placement chosen from the
ranks on this node (``LOCAL_WORLD_SIZE``). The backend and device that were *asked for* stay in the
value too, because under torchrun every node proposes a placement from that request and all ranks
agree on one (``torchrun.py``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from .backend import Placement, choose_placement, visible_gpus


@dataclass(frozen=True)
class World:
    """``size`` ranks placed by ``placement``; ``asked`` is the (backend, device) request it came from."""

    size: int
    placement: Placement
    asked: tuple[str, str] = ("auto", "auto")

    @property
    def backend(self) -> str:
        return self.placement.backend

    @property
    def device_type(self) -> str:
        return self.placement.device_type

    def __str__(self) -> str:
        return f"{self.size} rank(s), {self.backend} on {self.device_type}"


def resolve_world(world_size: int | World | None = None, backend: str = "auto", device: str = "auto") -> World:
    """The world ``world_size`` ranks run in on this machine (or under torchrun), or a ValueError.

    ``world_size`` may be a number, None (torchrun's world, else :func:`default_world_size`), or a
    :class:`World` already resolved, which is returned as it is - then ``backend`` and ``device``
    must be left at "auto" or agree with it.
    """
    if isinstance(world_size, World):
        world = world_size
        for name, asked, has in (("backend", backend, world.backend), ("device", device, world.device_type)):
            if asked not in ("auto", has):
                raise ValueError(f"{name}={asked!r} is not allowed with a resolved world ({world}): "
                                 f"leave {name}='auto' or resolve the world again with {name}={asked!r}")
        return world
    if under_torchrun():
        size = torchrun_world_size(world_size)
        local = int(os.environ.get("LOCAL_WORLD_SIZE", size))
        return World(size, choose_placement(local, backend, device), (backend, device))
    if world_size is None:
        world_size = default_world_size()
    return World(world_size, choose_placement(world_size, backend, device), (backend, device))


def default_world_size(limit: int = 4) -> int:
    """How many ranks the notebooks use unless the learner says otherwise.

    ``DPTEACH_WORLD_SIZE`` wins (Binder sets 2). Under torchrun, the world torchrun made. With two or
    more GPUs, one rank per GPU (up to ``limit``). Otherwise up to ``limit`` CPU ranks, at least 2 so
    that there is something to communicate, and no more than the cores (more would only queue).
    """
    if os.environ.get("DPTEACH_WORLD_SIZE"):
        return int(os.environ["DPTEACH_WORLD_SIZE"])
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ:
        return int(os.environ["WORLD_SIZE"])
    gpus = visible_gpus()
    if gpus >= 2:
        return min(gpus, limit)
    return max(2, min(limit, os.cpu_count() or 1))


def under_torchrun() -> bool:
    """True when this process is one rank of a world started by torchrun (or a SLURM recipe)."""
    return ("RANK" in os.environ and "WORLD_SIZE" in os.environ
            and "DPTEACH_PARENT_PID" not in os.environ)


def torchrun_world_size(world_size: int | None) -> int:
    """torchrun's ``WORLD_SIZE``, after checking that ``world_size`` (None or a number) agrees with it."""
    world = int(os.environ["WORLD_SIZE"])
    if world_size is not None and world_size != world:
        raise ValueError(f"world_size={world_size!r} does not match torchrun's WORLD_SIZE={world}: "
                         f"pass world_size={world} (or None) when running under torchrun")
    return world
