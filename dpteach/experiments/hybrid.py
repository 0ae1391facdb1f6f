"""Hybrid sharding on a network of two levels (lesson 14, sending less): what crosses the slow link.

``hybrid_sharding`` trains four strategies in one world of W ranks, placed in nodes of ``ranks_per_node``
(rank r in node r // ranks_per_node), on an emulated network that is fast inside a node and slow between
nodes (``dpteach/network/two_level.py``):

* ``ddp``: a flat ring over every rank - every step's all-reduce moves at the slow link's pace, and the
  share of the ring's hops that join two nodes carries its bytes across (with nodes of two: half);
* ``zero3``: the course's FSDP over every rank, flat too - 1.5 times DDP's bytes, with the same share across;
* ``fsdp``: torch's FSDP2 over every rank, the same bytes as ``zero3`` (counted as its ring would send them);
* ``hsdp``: the course's zero3 inside each node and one all-reduce of each gradient *shard* across nodes:
  only 2(R-1)/R x (Psi / S) bytes per rank cross (``dpteach/sync/hsdp.py``);
* ``hsdp_torch``: torch's ``fully_shard`` on the same (replicate, shard) mesh, the reference for ``hsdp``.

Each row gives the step time, the bytes per step and rank - in all, across nodes and inside them - as the
course's ``Comm`` counts them, and for the two hybrid strategies the bytes the kernel counted as received on
each group's gloo sockets (TCP_INFO; gloo ranks only), next to the expected 2(R-1)/R x the gradient shard's
bytes; and the largest |dtheta| from single-process training. ``ddp``, ``zero3`` and ``hsdp`` send through the
course's ``Comm`` and are timed on the emulated link (``hsdp`` on both levels: its node's group on the fast
one, its replicate group on the slow one); ``hsdp_torch``, like ``fsdp``, calls torch's collectives from inside
FSDP2, where no emulated link reaches: its time is this machine's own transfers, and its row says so.

What the sockets show inside a node is more than a ring needs: torch's gloo backend moves as many bytes for a
reduce-scatter as for an all-reduce, 2(S-1)/S of its input rather than (S-1)/S (measured here, on the shard
group's sockets; ``dist.reduce_scatter_tensor`` alone on two or four gloo ranks shows the same), so the
rows also give what gloo is expected to move inside (``expected_inside_gloo_per_step``). ``Comm`` keeps the
ring's account, which is what NCCL's ring moves.
"""
from __future__ import annotations

from .. import validate
from ..network.link import TwoLevelLink, resolve_two_level
from ..network.two_level import check_whole_nodes
from ..ranks.world import World
from ..sync import strategy_class
from .compare import compare_strategies

STRATEGIES = ("ddp", "zero3", "fsdp", "hsdp", "hsdp_torch")


def _across_set_by(ranks: list[dict]) -> str | None:
    """For a hybrid strategy, what set the time of its replicate group's messages (its ``notes``' across link)."""
    reports = [(r.get("notes") or {}).get("across_link") for r in ranks]
    reports = [rep for rep in reports if rep and rep["messages"]]
    return max(reports, key=lambda rep: rep["machine_bound_share"])["time_set_by"] if reports else None


def hybrid_sharding(world_size: int | World = 4, link="pcie/1gbe", ranks_per_node: int = 2, steps: int = 4,
                    model: str = "auto", backend: str = "auto", device: str = "auto", timeout: float = 300.0) -> dict:
    """ddp, zero3, fsdp, hsdp and hsdp_torch on ``world_size`` ranks, nodes of ``ranks_per_node``, on ``link``
    ("INSIDE/BETWEEN" of two presets, or a ``TwoLevelLink`` of the same node size).

    Returns ``{"world_size", "ranks_per_node", "nodes", "link", "model", "steps", "tolerance", "rows":
    [{"strategy", "step_time_s", "timed_on_link", "bytes_per_step", "bytes_between_per_step",
    "bytes_inside_per_step", "received_between_per_step", "received_inside_per_step",
    "expected_between_per_step", "expected_inside_gloo_per_step", "between_share", "max_abs_diff_vs_single", "within_tolerance",
    "time_set_by", "across_time_set_by"}],
    "not_emulated", "compare"}`` (bytes per rank; ``compare``: ``compare_strategies``' rows).
    """
    if not isinstance(world_size, World):
        validate.integer("world_size", world_size, low=2)
    validate.integer("ranks_per_node", ranks_per_node, low=1)
    validate.integer("steps", steps, low=1)
    validate.number("timeout", timeout, above=0)
    if isinstance(link, TwoLevelLink) and link.ranks_per_node != ranks_per_node:
        raise validate.refusal("link", link.name, f"its nodes hold {link.ranks_per_node} ranks, not "
                               f"ranks_per_node={ranks_per_node}; give the same node size to both")
    two_level = resolve_two_level(link, "link", ranks_per_node)
    size = world_size.size if isinstance(world_size, World) else world_size
    check_whole_nodes(size, ranks_per_node)
    result = compare_strategies(world_size, model=model, steps=steps, strategies=STRATEGIES, link=two_level,
                                backend=backend, device=device, timeout=timeout,
                                knobs={"hsdp_shard_size": ranks_per_node})
    tolerance = result["tolerance"]
    rows = []
    for row in result["rows"]:
        name, levels = row["strategy"], row["levels"]  # compare split each row's bytes by level
        diff = row["max_abs_diff_vs_single"]
        rows.append({
            "strategy": name, "step_time_s": row["step_time_s"], "timed_on_link": strategy_class(name).emulates_link,
            "bytes_per_step": row["bytes_per_step"],
            "bytes_between_per_step": levels["sent_between"], "bytes_inside_per_step": levels["sent_inside"],
            "received_between_per_step": levels["received_between"],
            "received_inside_per_step": levels["received_inside"],
            "expected_between_per_step": levels["expected_between"],
            "expected_inside_gloo_per_step": levels["expected_inside_gloo"],
            "between_share": (None if levels["sent_between"] is None or not row["bytes_per_step"]
                              else levels["sent_between"] / row["bytes_per_step"]),
            "max_abs_diff_vs_single": diff, "within_tolerance": None if diff is None else diff <= tolerance,
            # who set the time of most messages on each level: the emulated link, or this machine's own copies
            "time_set_by": (row["link_report"] or {}).get("time_set_by"),
            "across_time_set_by": _across_set_by(result["runs"][name])})
    return {"world_size": size, "ranks_per_node": ranks_per_node, "nodes": size // ranks_per_node,
            "link": two_level.as_dict(), "model": result["model"], "steps": steps, "tolerance": tolerance,
            "rows": rows,
            "not_emulated": {row["strategy"]: "FSDP2 calls torch's collectives itself, where no emulated link "
                             "reaches: its step time is this machine's own transfers, not the link's"
                             for row in rows if not row["timed_on_link"]},
            "compare": result["rows"]}
