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

**Emulated peers** (``peers="emulated"``). Most learners have one GPU. ``resolve_world(8,
peers="emulated")`` is a world of *one* real rank that stands for eight: it trains the real model on
the real device, and every collective it sends is timed by an emulated link (``dpteach.network``) as the
same collective among 8 ranks, with the bytes a rank of 8 would send. So the 8-GPU regime - how long
an all-reduce of these gradients takes, how much of it backward hides - shows on one GPU. What it
cannot show is anything the peers would have computed: gradients are not averaged (there is nothing
to average them with), and no replica can drift from another. Experiments that claim exactness,
memory per rank of sharded state, or asynchrony refuse such a world; the others say on every figure
"1 GPU + 7 emulated peers: timings emulate W=8; gradients are not averaged".
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from .. import validate
from .backend import Placement, choose_placement, visible_gpus
from .torchrun import check_joined, torchrun_sizes, under_torchrun


PEERS = ("real", "emulated")


@dataclass(frozen=True)
class World:
    """``size`` ranks placed by ``placement``; ``asked`` is the (backend, device) request it came from;
    ``emulated_size``: the world that ``size`` (then 1) real rank stands for, when its peers are emulated."""

    size: int
    placement: Placement
    asked: tuple[str, str] = ("auto", "auto")
    emulated_size: int | None = None

    @property
    def backend(self) -> str:
        return self.placement.backend

    @property
    def device_type(self) -> str:
        return self.placement.device_type

    @property
    def peers(self) -> str:
        return "real" if self.emulated_size is None else "emulated"

    @property
    def timed_size(self) -> int:
        """The world size the run's communication is timed and counted for."""
        return self.emulated_size or self.size

    def peers_note(self) -> str | None:
        """What every figure of an emulated-peers run says; None for real ranks."""
        if self.emulated_size is None:
            return None
        device = "GPU" if self.device_type == "cuda" else "CPU rank"
        return (f"1 {device} + {self.emulated_size - 1} emulated peers: timings emulate W={self.emulated_size}; "
                f"gradients are not averaged")

    def __str__(self) -> str:
        if self.emulated_size is not None:
            return f"1 real rank ({self.backend} on {self.device_type}) + {self.emulated_size - 1} emulated peers"
        return f"{self.size} rank(s), {self.backend} on {self.device_type}"


def resolve_world(world_size: int | World | None = None, backend: str = "auto", device: str = "auto",
                  peers: str | None = None, emulated_peers_ok: bool = False) -> World:
    """The world ``world_size`` ranks run in on this machine (or under torchrun), or a ValueError.

    ``world_size`` may be a number, None (torchrun's world, else :func:`default_world_size`), or a
    :class:`World` already resolved, which is returned as it is - then ``backend``, ``device`` and
    ``peers`` must be left at their defaults or agree with it. ``peers="emulated"`` resolves one real
    rank standing for ``world_size`` (see the module note); only callers that can report such a run
    honestly pass ``emulated_peers_ok=True``, and for the others a world with emulated peers is refused.
    """
    if peers is not None:
        validate.choice("peers", peers, PEERS)
    if isinstance(world_size, World):
        world = world_size
        for name, asked, has in (("backend", backend, world.backend), ("device", device, world.device_type),
                                 ("peers", peers or "auto", world.peers)):
            if asked not in ("auto", has):
                raise ValueError(f"{name}={asked!r} is not allowed with a resolved world ({world}): "
                                 f"leave {name} unset or resolve the world again with {name}={asked!r}")
    elif under_torchrun():
        if peers == "emulated":
            raise ValueError("peers='emulated' is not allowed under torchrun: torchrun's ranks are real ones; "
                             "leave peers unset, or run outside torchrun")
        size, local = torchrun_sizes(world_size)
        check_joined(backend, device)  # a world joined before decides; say so before choosing a placement
        world = World(size, choose_placement(local, backend, device), (backend, device))
    elif peers == "emulated":
        size = validate.integer("world_size", default_world_size() if world_size is None else world_size, low=2,
                                why=" with peers='emulated' (the world the one real rank stands for)")
        world = World(1, choose_placement(1, backend, device), (backend, device), emulated_size=size)
    else:
        if world_size is None:
            world_size = default_world_size()
        world = World(world_size, choose_placement(world_size, backend, device), (backend, device))
    if world.emulated_size is not None and not emulated_peers_ok:
        raise ValueError(f"peers='emulated' ({world}) is not allowed here: this experiment shows what only real "
                         f"ranks can (results equal to single-process training, memory per rank, messages between "
                         f"processes); use real ranks")
    return world


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

