"""What model states cost per rank: the ZeRO paper's arithmetic, for any model size and world.

Per parameter, following Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models" (SC 2020), section 3.1:

==================  ==========  =========  =============================================
training recipe     parameters  gradients  optimizer state
==================  ==========  =========  =============================================
fp32, SGD           4           4          0
fp32, SGD+momentum  4           4          4   (momentum buffer)
fp32, Adam          4           4          8   (first and second moments)
mixed, SGD          2           2          4   (fp32 master weights)
mixed, SGD+mom.     2           2          8   (master weights + momentum)
mixed, Adam         2           2          12  (master weights + two moments: the paper's K = 12)
==================  ==========  =========  =============================================

ZeRO shards these over the W data-parallel ranks: stage 1 the optimizer state, stage 2 also the
gradients, stage 3 also the parameters; a sharded part costs 1/W of its bytes per rank. Traffic (the
paper's section 7): 2 Psi elements per step for plain data parallelism and stages 1 and 2, 3 Psi for
stage 3, of which a ring puts (W-1)/W on each rank's link.

Lesson 01 shows this table (``experiments.memory.memory_per_replica``) and lesson 11 prices each stage
with it (``experiments.sharding.sharding_payoff``); both read it here, so neither borrows from the other.
"""
from __future__ import annotations

from .. import validate

OPTIMIZERS = ("sgd", "sgd_momentum", "adam")
PRECISIONS = ("fp32", "mixed")
STAGES = (0, 1, 2, 3)
GB = 1e9  # decimal gigabytes, as GPU data sheets and the ZeRO paper count

# bytes per parameter: (parameters, gradients, optimizer state)
BYTES_PER_PARAM = {
    ("fp32", "sgd"): (4, 4, 0), ("fp32", "sgd_momentum"): (4, 4, 4), ("fp32", "adam"): (4, 4, 8),
    ("mixed", "sgd"): (2, 2, 4), ("mixed", "sgd_momentum"): (2, 2, 8), ("mixed", "adam"): (2, 2, 12),
}


# What each ZeRO stage shards, as ``sync.Strategy.shards`` names it (the strategies hold these same tuples).
STAGE_SHARDS = {0: (), 1: ("optimizer state",), 2: ("optimizer state", "gradients"),
                3: ("optimizer state", "gradients", "parameters")}
_PART_NAMES = {"params": "parameters", "grads": "gradients", "optimizer": "optimizer state"}


def held_per_rank(parts: dict, world_size: int, shards) -> dict:
    """Bytes one rank holds of each part (``params``, ``grads``, ``optimizer``) when the parts named in
    ``shards`` are split over ``world_size`` ranks; with their ``total``."""
    out = {k: parts[k] / world_size if _PART_NAMES[k] in shards else parts[k] for k in _PART_NAMES}
    out["total"] = sum(out.values())
    return out


def _per_rank(parts: dict, world_size: int, stage: int) -> dict:
    """Bytes one rank holds of each part at ZeRO ``stage`` (0 = plain data parallelism)."""
    return held_per_rank(parts, world_size, STAGE_SHARDS[stage])


def traffic_per_rank(num_params: float, bytes_per_grad: int, world_size: int, stage: int) -> float:
    """Bytes one rank sends per step at ZeRO ``stage``: 2 Psi (stages 0-2) or 3 Psi (stage 3)
    elements in all (ZeRO section 7), of which a ring puts (W-1)/W on each rank's link."""
    volume = 3 if stage == 3 else 2
    return volume * num_params * bytes_per_grad * (world_size - 1) / world_size


def model_state_bytes(params_billion: float = 7.0, optimizer: str = "adam", precision: str = "mixed",
                       world_size: int = 8, zero_stage: int = 0, gpu_gb: float = 80.0) -> dict:
    """Bytes per rank for a model of ``params_billion`` x 1e9 parameters; pure arithmetic, instant.

    Returns plain data::

        {"params", "bytes_per_param": {params, grads, optimizer, total},
         "replica_bytes": {params, grads, optimizer, total},        # unsharded (ZeRO stage 0)
         "per_rank_bytes": {...},                                   # at the chosen zero_stage
         "by_stage": [{stage, params, grads, optimizer, total, fits,
                       traffic_bytes (sent per rank per step)}, ...],       # stages 0..3
         "max_params_billion": {stage: largest model that fits in gpu_gb}, "fits", ...inputs}
    """
    validate.number("params_billion", params_billion, above=0)
    validate.integer("world_size", world_size, low=1)
    validate.number("gpu_gb", gpu_gb, above=0, unit="a number of GB")
    validate.choice("optimizer", optimizer, OPTIMIZERS)
    validate.choice("precision", precision, PRECISIONS)
    validate.choice("zero_stage", zero_stage, STAGES)
    n = params_billion * 1e9
    p, g, o = BYTES_PER_PARAM[(precision, optimizer)]
    replica = {"params": p * n, "grads": g * n, "optimizer": o * n}
    replica["total"] = sum(replica.values())
    capacity = gpu_gb * GB
    by_stage, largest = [], {}
    for stage in STAGES:
        row = _per_rank(replica, world_size, stage)
        by_stage.append({"stage": stage, **row, "fits": row["total"] <= capacity,
                         "traffic_bytes": traffic_per_rank(n, g, world_size, stage)})
        per_param = _per_rank({"params": p, "grads": g, "optimizer": o}, world_size, stage)["total"]
        largest[stage] = capacity / per_param / 1e9
    return {
        "params": n, "params_billion": params_billion, "optimizer": optimizer, "precision": precision,
        "world_size": world_size, "zero_stage": zero_stage, "gpu_gb": gpu_gb,
        "bytes_per_param": {"params": p, "grads": g, "optimizer": o, "total": p + g + o},
        "replica_bytes": replica, "per_rank_bytes": _per_rank(replica, world_size, zero_stage),
        "by_stage": by_stage, "max_params_billion": largest,
        "fits": by_stage[zero_stage]["fits"],
    }
