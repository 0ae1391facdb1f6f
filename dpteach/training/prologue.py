"""What every training experiment settles once, before its ranks start: the world, the link, the model.

Each lesson's experiment used to open with the same lines: resolve the world, check it has enough ranks,
resolve the link, size the model for the run (``replica/sizing.py``), build a ``TrainConfig`` for it, launch
the ranks in that world, find the device the single-process reference trains on, and open the report with the
run's facts. :func:`set_up` does all of it once and returns a :class:`Setup`, which the experiment then asks::

    setup = set_up(world_size, backend, device, peers, model=model, link=link, emulated_peers_ok=True,
                   load=lambda world: RunLoad(steps=10 * steps, models_at_once=10))
    base = TrainConfig(**setup.fields(), steps=steps, bucket_mb=bucket_mb)  # model, batch, link, timed world
    per_rank = setup.on_ranks(train_each_on_rank, [c.check(setup.world) for c in configs], True, timeout=600)
    reference = train_single_process(base, setup.world.size, device=setup.reference_device)
    return {**setup.facts, ...}

The world is resolved here and nowhere after: ``launch_in`` takes the resolved ``World`` as it is. With emulated
peers (one real rank standing for W, ``ranks/world.py``) the world size the strategies time their messages for
travels to the ranks inside each config (``TrainConfig.timed_world_size``), as an argument like any other.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from .. import validate
from ..network.link import Link, resolve_link
from ..ranks.launcher import launch_in
from ..ranks.world import World, resolve_world
from ..replica.sizing import ModelChoice, RunLoad, check_model, choose_model, run_facts
from .reference import reference_device


@dataclass(frozen=True)
class Setup:
    """One experiment's world, link and model, settled before any rank starts."""

    world: World
    link: Link | None
    choice: ModelChoice

    @property
    def real(self) -> bool:
        """Whether every rank is real (False: one real rank whose peers the link emulates)."""
        return self.world.emulated_size is None

    @property
    def facts(self) -> dict:
        """What every report opens with: the world, the peers, the backend and device, the model chosen."""
        return run_facts(self.world, self.choice)

    def fields(self, batch_per_rank: int | None = None) -> dict:
        """What every ``TrainConfig`` of this setup says: the chosen model, its batch (unless ``batch_per_rank`` is
        given), the link, and the world size an emulated world times its messages for::

            TrainConfig(**setup.fields(), strategy="ddp", steps=8)
        """
        return {"model": self.choice.name, "batch_per_rank": batch_per_rank or self.choice.batch_per_rank,
                "link": self.link, "timed_world_size": self.world.emulated_size}

    def on_ranks(self, fn, *args, timeout: float) -> list:
        """``fn(*args)`` on every rank of this world; the ranks' results, by rank."""
        return launch_in(self.world, fn, args, timeout=timeout)

    @property
    def reference_device(self):
        """Where the single-process reference trains: the ranks' kind of device (``reference.exact_tolerance``
        says why it matters)."""
        return reference_device(self.world.placement)


def set_up(world_size: int | World | None, backend: str = "auto", device: str = "auto", peers: str | None = None, *,
           model: str = "auto", link=None, load: Callable[[World], RunLoad] | RunLoad | None = None,
           at_least: int = 1, why: str = "", emulated_peers_ok: bool = False) -> Setup:
    """Resolve the world (at least ``at_least`` ranks, ``why`` says what for), the link (a preset name, a ``Link``,
    ``{"alpha_s", "beta_s_per_byte"}`` or None) and the model (``"auto"``: sized for ``load``, a ``RunLoad`` or a
    function of the world that returns one). Bad arguments are refused here, before any process starts."""
    check_model(model)
    world = resolve_world(world_size, backend, device, peers, emulated_peers_ok=emulated_peers_ok)
    if at_least > 1:
        validate.ranks(world, at_least, why)
    link = resolve_link(link)
    load = load(world) if callable(load) else load or RunLoad(steps=1)
    if load.link is None and link is not None:
        load = replace(load, link=link)
    return Setup(world, link, choose_model(model, world, load))
