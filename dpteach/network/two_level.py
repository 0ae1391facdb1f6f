"""A network of two levels: a fast link between the ranks of one node, a slow one between nodes.

Real clusters are built this way - NVLink or PCIe among the GPUs of a machine, InfiniBand or Ethernet
between machines - and the gap is one to three orders of magnitude (``link.PRESETS``). Hybrid sharding
(HSDP, ``dpteach/sync/hsdp.py``) exists because of it: it keeps the heavy traffic (all-gathers and
reduce-scatters of every layer) on the fast level and sends only one all-reduce of a gradient *shard*
across the slow one (Zhao et al., "PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel",
VLDB 2023, section 3.2 on sharding strategies, "hybrid sharding").

Ranks are placed in nodes in order: rank r sits in node ``r // ranks_per_node`` (what torchrun does with
``--nproc-per-node``). A :class:`TwoLevelLink` is also a :class:`Link` - the *between* one's costs: a
collective whose ring spans nodes moves no faster than its slowest hop, so that is the pace of every flat
collective of the world. ``Comm`` (``comm.py``) asks :func:`levels` which level a process group's
collectives run on (``inside`` when all its ranks share a node, else ``between``) and what share of its
ring's hops cross nodes, to split the bytes it counts by level.

What this leaves out: a ring over several nodes does not really send *every* byte at the slow pace - only
the hops that cross nodes are slow, and the rest finish early and wait; NCCL also builds rings and trees
aware of the topology (``src/graph/``), and runs several at once over a node's NICs. The share of crossing
hops is the average over a group's ranks: in a ring each rank sends to one successor only, so one rank's
bytes are all inside or all between.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import validate
from .link import Link, TwoLevelLink

@dataclass(frozen=True)
class Levels:
    """Where one process group's collectives run on a :class:`TwoLevelLink`: ``ranks`` (global, in the
    group's order, which is its ring's), the ``link`` of the level they run at, and ``crossing_share``,
    the share of the ring's hops r_i -> r_(i+1) that cross nodes."""

    ranks: tuple
    ranks_per_node: int
    link: Link
    crossing_share: float

    def between(self, nbytes: int) -> int:
        """Of ``nbytes`` sent on this group's ring, the bytes that cross nodes (the rest stay inside)."""
        return int(round(nbytes * self.crossing_share))

    def as_dict(self) -> dict:
        return {"ranks": list(self.ranks), "ranks_per_node": self.ranks_per_node, "level": self.link.name,
                "crossing_share": self.crossing_share}


def crossing_share(ranks, ranks_per_node: int) -> float:
    """The share of a ring's hops over ``ranks`` (in order, the last back to the first) that join two nodes:
    ranks 0,1,2,3 in nodes {0,1},{2,3}: 1->2 and 3->0 cross, 2 of 4; a ring of 0 and 2: both hops cross."""
    ranks = list(ranks)
    if len(ranks) < 2:
        return 0.0
    hops = zip(ranks, ranks[1:] + ranks[:1])
    return sum(a // ranks_per_node != b // ranks_per_node for a, b in hops) / len(ranks)


def levels(link: TwoLevelLink, ranks) -> Levels:
    """Which level a group of global ``ranks`` runs on - ``inside`` if they all sit in one node, else
    ``between`` (the slowest hop sets a ring's pace) - and what share of its ring crosses nodes."""
    ranks = tuple(ranks)
    one_node = len({link.node(r) for r in ranks}) == 1
    return Levels(ranks, link.ranks_per_node, link.inside if one_node else link.between,
                  crossing_share(ranks, link.ranks_per_node))


def check_whole_nodes(world_size: int, ranks_per_node: int) -> int:
    """``world_size // ranks_per_node``, the nodes, when the ranks fill at least two of them (a slow level to
    cross); else a refusal naming the world size."""
    if world_size % ranks_per_node or world_size // ranks_per_node < 2:
        raise validate.refusal("world_size", world_size, f"it must be a multiple of ranks_per_node={ranks_per_node} "
                               f"that makes at least two nodes (a slow level to cross): e.g. {2 * ranks_per_node}")
    return world_size // ranks_per_node
