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
from .link import PRESETS, Link

# Combinations the lessons use; any "INSIDE/BETWEEN" of two names of link.PRESETS is accepted.
EXAMPLES = ("nvlink/ib", "nvlink/1gbe", "nvlink/wan", "pcie/10gbe", "pcie/1gbe")


@dataclass(frozen=True, init=False)
class TwoLevelLink(Link):
    """``inside`` among the ranks of a node, ``between`` nodes of ``ranks_per_node`` ranks each. As a
    :class:`Link` it costs what ``between`` costs (the pace of a ring that spans nodes)."""

    inside: Link | None = None
    between: Link | None = None
    ranks_per_node: int = 2

    def __init__(self, inside: Link, between: Link, ranks_per_node: int = 2, name: str | None = None):
        for argument, level in (("inside", inside), ("between", between)):
            if not isinstance(level, Link) or isinstance(level, TwoLevelLink):
                raise validate.refusal(argument, level, "give one level's dpteach.network.Link (a preset: "
                                                        f"{', '.join(PRESETS)})")
        validate.integer("ranks_per_node", ranks_per_node, low=1)
        title = (f"{inside.title or inside.name} inside nodes of {ranks_per_node} ranks, "
                 f"{between.title or between.name} between them")
        super().__init__(name or f"{inside.name}/{between.name}", between.alpha_s, between.beta_s_per_byte,
                         between.gamma_s_per_byte, title, f"inside: {inside.source}; between: {between.source}")
        for field, value in (("inside", inside), ("between", between), ("ranks_per_node", ranks_per_node)):
            object.__setattr__(self, field, value)

    def node(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def as_dict(self) -> dict:
        """The link in a report: its own (between) costs, both levels and the node size; ``resolve_link`` reads
        it back."""
        return {**super().as_dict(), "inside": self.inside.as_dict(), "between": self.between.as_dict(),
                "ranks_per_node": self.ranks_per_node}


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


def resolve_two_level(link, argument: str = "link", ranks_per_node: int = 2) -> TwoLevelLink:
    """``"INSIDE/BETWEEN"`` (two names of ``link.PRESETS``; nodes of ``ranks_per_node`` ranks) or a
    :meth:`TwoLevelLink.as_dict` -> a :class:`TwoLevelLink`."""
    from .link import resolve_link
    if isinstance(link, TwoLevelLink):
        return link
    if isinstance(link, dict) and {"inside", "between"} <= set(link):
        return TwoLevelLink(resolve_link(link["inside"], f"{argument}['inside']"),
                            resolve_link(link["between"], f"{argument}['between']"),
                            link.get("ranks_per_node", ranks_per_node))
    names = link.split("/") if isinstance(link, str) else []
    if len(names) != 2 or not all(name in PRESETS for name in names):
        raise validate.refusal(argument, link, "a two-level link is 'INSIDE/BETWEEN', two of the presets "
                               f"{', '.join(PRESETS)} (e.g. {', '.join(EXAMPLES[:4])}), or a TwoLevelLink")
    return TwoLevelLink(PRESETS[names[0]], PRESETS[names[1]], ranks_per_node)
