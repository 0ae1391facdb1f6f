"""Lesson 16: the frontier of sending less - ZeRO++, DeMo, streaming DiLoCo and a distributed Muon step.

Three experiments, each one world:

* ``zeropp_levels``: zero3, ZeRO++ with each of its parts alone and all three, and hsdp, side by side on a network of
  two levels (``network/two_level.py``): the bytes each sends per step and rank across nodes and inside them, as the
  course's ``Comm`` counts them and as the kernel counted them on the gloo sockets (``sync/zeropp.py``), the
  quantisation error each part added (largest rounding, as a share of its bound), and how far each ends from zero3.
* DeMo and streaming DiLoCo against ddp and DiLoCo run on lesson 14's machinery: ``sending_less.frontier_methods``
  and ``sending_less.frontier_time_to_target``.
* ``muon_against_torch``: one distributed Muon step (``sync/muon.py``) on W ranks against ``torch.optim.Muon`` in
  one process, on the same gradients: gradients chosen so that their mean is exact in float32 whatever the order
  of the sum, because torch's Newton-Schulz runs in bfloat16 and would magnify any other difference.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .. import validate
from ..network.link import resolve_two_level
from ..network.two_level import check_whole_nodes
from ..ranks import context
from ..ranks.launcher import launch
from ..ranks.world import World, resolve_world
from ..replica.build import make_optimizer
from ..replica.models import build_model, check_model_name
from ..replica.timeline import Timeline
from ..training.train import TrainConfig
from .compare import compare_strategies

ZEROPP_VARIANTS = {"zero3": "zero3", "hpZ only": "zeropp(qwz=False,qgz=False)",
                   "qwZ only": "zeropp(hpz=False,qgz=False)", "qgZ only": "zeropp(qwz=False,hpz=False)",
                   "ZeRO++ (all three)": "zeropp", "hsdp": "hsdp"}


def zeropp_levels(world_size: int | World = 4, link="pcie/1gbe", ranks_per_node: int = 2, steps: int = 4,
                  variants=tuple(ZEROPP_VARIANTS), backend: str = "auto", timeout: float = 300.0) -> dict:
    """The variants of ``ZEROPP_VARIANTS`` named in ``variants`` on ``world_size`` ranks in nodes of
    ``ranks_per_node``, on ``link`` ("INSIDE/BETWEEN"). Returns ``{"world_size", "ranks_per_node", "link", "steps",
    "tolerance", "rows": [{"variant", "strategy", "bytes_between_per_step", "bytes_inside_per_step",
    "received_between_per_step", "received_inside_per_step", "between_vs_zero3", "measured_vs_counted",
    "quantisation", "max_abs_diff_vs_zero3", "max_abs_diff_vs_single", "final_loss", "losses", "step_time_s"}]}``
    (bytes per rank and step)."""
    if isinstance(variants, str) or not variants or any(v not in ZEROPP_VARIANTS for v in variants):
        raise validate.refusal("variants", variants, f"give a list of names from {', '.join(ZEROPP_VARIANTS)}")
    validate.integer("ranks_per_node", ranks_per_node, low=1)
    validate.integer("steps", steps, low=1)
    two_level = resolve_two_level(link, "link", ranks_per_node)
    size = world_size.size if isinstance(world_size, World) else world_size
    validate.integer("world_size", size, low=2)
    nodes = check_whole_nodes(size, ranks_per_node)
    names = list(dict.fromkeys(["zero3", *variants]))  # zero3 is what every other is measured against
    result = compare_strategies(world_size, model="mlp", steps=steps, strategies=[ZEROPP_VARIANTS[v] for v in names],
                                link=two_level, backend=backend, timeout=timeout, interleave=True,
                                knobs={"hsdp_shard_size": ranks_per_node})
    by_spec = {row["strategy"]: row for row in result["rows"]}
    zero3 = by_spec["zero3"]
    zero3_params = result["runs"]["zero3"][0]["params"]
    rows = []
    for variant in names:
        spec = ZEROPP_VARIANTS[variant]
        row, ranks = by_spec[spec], result["runs"][spec]
        counted, measured = row["bytes_between_per_step"], row["received_between_per_step"]
        rows.append({
            "variant": variant, "strategy": spec, "knobs": row["knobs"],
            "bytes_per_step": row["bytes_per_step"], "bytes_between_per_step": counted,
            "bytes_inside_per_step": row["bytes_inside_per_step"], "received_between_per_step": measured,
            "received_inside_per_step": row["received_inside_per_step"],
            "between_vs_zero3": counted / zero3["bytes_between_per_step"],
            "measured_vs_counted": None if measured is None or not counted else measured / counted,
            "quantisation": row["quantisation"],
            "max_abs_diff_vs_zero3": (ranks[0]["params"] - zero3_params).abs().max().item(),
            "max_abs_diff_vs_single": row["max_abs_diff_vs_single"], "final_loss": row["final_loss"],
            "losses": ranks[0]["losses"], "step_time_s": row["step_time_s"],
            "peak_bytes_per_rank": row["peak_bytes_per_rank"]})
    return {"world_size": size, "ranks_per_node": ranks_per_node, "nodes": nodes,
            "link": two_level.as_dict(), "steps": steps, "tolerance": result["tolerance"], "rows": rows}


def _muon_on_rank(seed: int, name: str) -> dict:
    """One distributed Muon step on this rank; rank 0 also steps torch's Muon in one process on the mean."""
    from ..sync.muon import DistributedMuon
    config = TrainConfig(model=name, optimizer="muon")
    world, rank = dist.get_world_size(), dist.get_rank()
    model = build_model(name, seed=seed, device=context.device())
    single = build_model(name, seed=seed, device=context.device())
    generator = torch.Generator().manual_seed(seed)
    # each rank's gradient W times a multiple of 1/64: divided by W first (the ranks) or after the sum (one
    # process), and summed in any order, float32 gets every mean exactly, so both see the same gradient bit for bit
    grads = [[torch.randint(-256, 256, p.shape, generator=generator).float() * world / 64 for p in model.parameters()]
             for _ in range(world)]
    strategy = DistributedMuon(model, Timeline(context.device()))
    optimizer = strategy.make_optimizer(lambda params: make_optimizer(config, params))
    strategy.start_step(0)
    for p, g in zip(model.parameters(), grads[rank]):
        p.grad = g.clone()
    strategy.finish(0)
    strategy.step_optimizer(optimizer)
    out = {"rank": rank, "owned": strategy.notes["owned"], "bytes": strategy.wire_bytes,
           "padding_elements": strategy.padding, "block_elements": strategy.block,
           "momentum_elements": sum(s["momentum_buffer"].numel() for s in optimizer.state.values()
                                    if "momentum_buffer" in s)}
    reference = make_optimizer(config, list(single.parameters()))
    for i, p in enumerate(single.parameters()):
        p.grad = sum(g[i] for g in grads) / world
    reference.step()
    out["max_abs_diff"] = max((a - b).abs().max().item() for a, b in zip(model.parameters(), single.parameters()))
    out["moved"] = max((a - b).abs().max().item() for a, b in
                       zip(single.parameters(), build_model(name, seed=seed, device=context.device()).parameters()))
    strategy.close()
    return out


def muon_against_torch(world_size: int | World | None = 2, seed: int = 0, model: str = "transformer",
                       backend: str = "auto", timeout: float = 120.0) -> dict:
    """One distributed Muon step on ``world_size`` ranks against torch's Muon in one process, on the same
    gradients. Returns ``{"world_size", "model", "tolerance", "ranks": [{"rank", "owned", "bytes",
    "padding_elements", "block_elements", "momentum_elements", "max_abs_diff", "moved"}], "max_abs_diff",
    "equal"}``.

    The small transformer by default: eleven matrices of many shapes to hand out whole, and quick to orthogonalise
    on any CPU. Muon's Newton-Schulz iterations multiply in bfloat16 (``_zeropower_via_newtonschulz`` in torch's
    ``optim/_muon.py`` casts the gradient with ``.bfloat16()``), and a CPU without bfloat16 instructions multiplies
    in bfloat16 far more slowly than in float32 (on a 2-core AVX2 machine a 512 x 512 product took 204 ms against
    3.7 ms): there the mlp's 512 x 512 matrices made this one step take 15 s."""
    validate.integer("seed", seed, low=0)
    check_model_name(model)
    world = resolve_world(world_size, backend, "auto")
    ranks = launch(_muon_on_rank, world, args=(seed, model), timeout=timeout)
    worst = max(r["max_abs_diff"] for r in ranks)
    tolerance = 1e-6
    return {"world_size": world.size, "model": model, "tolerance": tolerance, "ranks": ranks, "max_abs_diff": worst,
            "equal": worst <= tolerance}
