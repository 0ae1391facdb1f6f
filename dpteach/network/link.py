"""A network link as the alpha-beta(-gamma) model sees it, and the published links the course uses.

One value, used everywhere a link appears: the emulated link the lessons train on (``dpteach.network.emulated``),
the cost model's predictions (``dpteach.network.costmodel``, whose fits return one), the scaling simulator
(``dpteach.network.scaling``) and the model sizing (``dpteach.replica.sizing``). Three numbers describe it:

* ``alpha_s``: latency, the seconds one message costs before its first byte arrives;
* ``beta_s_per_byte``: the seconds each byte takes on the wire, 1 / bandwidth;
* ``gamma_s_per_byte``: the seconds each byte takes to reduce (add) at the receiver; usually small next
  to beta, and 0 unless given.

A link given by a learner may be a preset name (``"ib"``), a :class:`Link`, or a dict with ``alpha_s``
and ``beta_s_per_byte`` (what a fit in a report holds); :func:`resolve_link` turns any of them into a
:class:`Link` and says what is allowed when it cannot.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .. import validate


@dataclass(frozen=True)
class Link:
    """A network: ``alpha_s`` per message, ``beta_s_per_byte`` per byte sent, ``gamma_s_per_byte`` per
    byte reduced. ``title`` says what it stands for in a plot's legend; ``source`` where its figures come from."""

    name: str
    alpha_s: float
    beta_s_per_byte: float
    gamma_s_per_byte: float = 0.0
    title: str = ""
    source: str = ""

    def __post_init__(self):
        for field in ("alpha_s", "beta_s_per_byte", "gamma_s_per_byte"):
            object.__setattr__(self, field, validate.number(field, getattr(self, field), low=0,
                                                            unit="a number of seconds"))

    @classmethod
    def from_bandwidth(cls, name: str, alpha_s: float, bandwidth_GBps: float, *, reduce_GBps: float | None = None,
                       title: str = "", source: str = "") -> "Link":
        """A link from a latency in seconds and bandwidths in GB/s (1 GB = 1e9 bytes, as nccl-tests counts);
        an infinite bandwidth is a link whose bytes cost nothing, ``reduce_GBps=None`` a free reduction."""
        def seconds_per_byte(argument, GBps):
            if GBps == math.inf:
                return 0.0
            return 1.0 / (validate.number(argument, GBps, above=0, unit="a bandwidth in GB/s (or math.inf)") * 1e9)
        gamma = 0.0 if reduce_GBps is None else seconds_per_byte("reduce_GBps", reduce_GBps)
        return cls(name, alpha_s, seconds_per_byte("bandwidth_GBps", bandwidth_GBps), gamma, title or name, source)

    @property
    def bandwidth_GBps(self) -> float:
        """1 / beta in GB/s; infinite when bytes cost nothing (a fit that found no slope)."""
        return math.inf if self.beta_s_per_byte == 0 else 1.0 / self.beta_s_per_byte / 1e9

    @property
    def label(self) -> str:
        """What a legend shows: the title and the two numbers that matter."""
        return f"{self.title or self.name} (alpha {self.alpha_s * 1e6:.3g} us, {self.bandwidth_GBps:.3g} GB/s)"

    def as_dict(self) -> dict:
        """The link in a report (JSON): name and costs (gamma only where it has one); :func:`resolve_link` reads
        it back."""
        gamma = {"gamma_s_per_byte": self.gamma_s_per_byte} if self.gamma_s_per_byte else {}
        return {"name": self.name, "alpha_s": self.alpha_s, "beta_s_per_byte": self.beta_s_per_byte, **gamma}


# Order-of-magnitude figures per direction, as published. Measure your own: ``dpteach bench``, or
# nccl-tests on GPUs (its doc/PERFORMANCE.md explains bus bandwidth).
PRESETS = {link.name: link for link in (
    Link.from_bandwidth("nvlink", 3e-6, 450.0, title="NVLink 4, inside one 8-GPU node",
                        source="NVIDIA H100 SXM: 900 GB/s bidirectional per GPU"),
    Link.from_bandwidth("pcie", 5e-6, 25.0, title="PCIe 4.0 x16",
                        source="32 GB/s per direction, about 25 achieved"),
    Link.from_bandwidth("ib", 5e-6, 50.0, title="InfiniBand NDR, one 400 Gb/s port",
                        source="ConnectX-7: 400 Gb/s = 50 GB/s per port"),
    # NCCL builds several rings at once and spreads them over all of a node's NICs, one per GPU on a
    # DGX-class node ("rails"; NCCL src/graph/topo.cc), so the part of a ring that crosses nodes runs at
    # the node's aggregate bandwidth. Only the scaling simulator, which models whole nodes, uses it.
    Link.from_bandwidth("ib_8nics", 5e-6, 400.0, title="InfiniBand NDR across 8-GPU nodes, 8 NICs per node",
                        source="8 x 400 Gb/s ConnectX-7 per DGX H100 node (DGX BasePOD reference architecture)"),
    Link.from_bandwidth("10gbe", 25e-6, 1.25, title="10 Gbit/s Ethernet", source="TCP: tens of microseconds"),
    Link.from_bandwidth("1gbe", 50e-6, 0.125, title="1 Gbit/s Ethernet", source="TCP: tens of microseconds"),
    # Between data centres: light in fibre covers about 200 km per millisecond (refractive index ~1.5), so
    # 4,000 km of fibre (a continent) is 20 ms one way before any routing; a few Gbit/s is what one flow
    # across a shared wide-area path may get. Of the two figures, 20 ms is physics and 10 ms of routing and the
    # 2.5 Gbit/s are round figures chosen for the lesson, not measurements (lesson 14 says so). The regime
    # DiLoCo (Douillard et al. 2023) was made for.
    Link.from_bandwidth("wan", 30e-3, 0.3125, title="wide area, between data centres (30 ms, 2.5 Gbit/s)",
                        source="fibre: ~5 us per km; 4,000 km plus routing; 2.5 Gbit/s per flow assumed"),
)}


def resolve_link(link, argument: str = "link") -> Link | None:
    """``None``, a preset name, a :class:`Link`, or ``{"alpha_s", "beta_s_per_byte"[, "name",
    "gamma_s_per_byte"]}`` (a fit in a report) -> a :class:`Link` (or None). A network of two levels,
    ``"INSIDE/BETWEEN"`` (two presets; nodes of two ranks) or a ``TwoLevelLink``'s dict, is a ``TwoLevelLink``
    (``two_level.py``)."""
    if link is None or isinstance(link, Link):  # a TwoLevelLink is a Link too
        return link
    if (isinstance(link, str) and "/" in link) or (isinstance(link, dict) and "between" in link):
        return resolve_two_level(link, argument)
    if isinstance(link, str):
        if link not in PRESETS:
            raise validate.refusal(argument, link, f"choose one of {', '.join(PRESETS)} (or two of them, "
                                   "'INSIDE/BETWEEN': nodes on a fast link, a slow one between them), give "
                                   "{'alpha_s': ..., 'beta_s_per_byte': ...}, or None for no emulated link")
        return PRESETS[link]
    if isinstance(link, dict) and {"alpha_s", "beta_s_per_byte"} <= set(link):
        costs = {}
        for field in ("alpha_s", "beta_s_per_byte", "gamma_s_per_byte"):
            costs[field] = validate.number(f"{argument}[{field!r}]", link.get(field, 0.0), low=0,
                                           unit="a number of seconds")
        return Link(str(link.get("name", "custom")), **costs, source=str(link.get("source", "given")))
    raise validate.refusal(argument, link, f"give a preset name ({', '.join(PRESETS)}), a dict with "
                           "alpha_s and beta_s_per_byte, or None")


# A network of two levels (``two_level.py`` says which level a group runs on): combinations the lessons use;
# any "INSIDE/BETWEEN" of two names of PRESETS is accepted.
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


def resolve_two_level(link, argument: str = "link", ranks_per_node: int = 2) -> TwoLevelLink:
    """``"INSIDE/BETWEEN"`` (two names of ``link.PRESETS``; nodes of ``ranks_per_node`` ranks) or a
    :meth:`TwoLevelLink.as_dict` -> a :class:`TwoLevelLink`."""
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
