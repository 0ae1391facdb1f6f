"""``powersgd_against_torch``: the course's PowerSGD and torch's own hook, fed the same gradients, on real ranks.

What is compared, and how torch's hook is handed the course's buckets, is in ``powersgd_pairs.py`` (which
lesson 14's ``sending_less`` also runs, inside the world its methods train in).
"""
from __future__ import annotations

from .. import validate
from ..ranks.launcher import launch
from ..ranks.world import World, resolve_world
from ..replica.buckets import build_buckets
from ..replica.models import SPECS, build_model
from .powersgd_pairs import MODEL, on_rank

def powersgd_against_torch(world_size: int | World = 2, rank: int = 4, steps: int = 4, seed: int = 0, start: int = 2,
                           timeout: float = 120.0, known: dict | None = None) -> dict:
    """The course's PowerSGD and torch's ``powerSGD_hook`` on the same gradients, ``steps`` steps, of which the
    first ``start`` are plain all-reduce (torch requires ``start >= 2`` with error feedback or warm start).

    Returns ``{"model", "world_size", "rank", "start", "steps", "bucket_sizes", "compared", "rows": [{"step",
    "compressed", "max_abs_diff", "max_abs_grad", "torch_bytes", "course_bytes", "course_comm_bytes", "uncompressed_bytes",
    "torch_all_reduces", "course_all_reduces"}], "max_abs_diff", "compression_ratio", "torch_compression_ratio"}``:
    per step the worst rank's difference and rank 0's bytes; the ratios are uncompressed bytes over sent
    bytes on the compressing steps (None when none compressed). ``known``: a run that already made this check
    in its own world with the same arguments (``sending_less.methods_to_target`` makes it beside its methods, and
    hands back each rank's rows as ``"powersgd_check"``): its rows are read instead of starting ranks again.
    """
    if not isinstance(world_size, World):
        validate.integer("world_size", world_size, low=2, why=": one rank has nothing to average")
    validate.integer("rank", rank, low=1)
    validate.integer("steps", steps, low=1)
    validate.integer("seed", seed, low=0)
    validate.integer("start", start, low=2, why=": torch's PowerSGDState refuses less with error feedback on")
    validate.number("timeout", timeout, above=0, unit="a number of seconds")
    made = (known or {}).get("powersgd_check")
    size = world_size.size if isinstance(world_size, World) else world_size
    if made and made["args"] == [rank, start, steps, seed] and made["world_size"] == size:
        per_rank = made["per_rank"]
    else:
        world = resolve_world(world_size)
        validate.ranks(world, 2, "one rank has nothing to average")
        per_rank = launch(on_rank, world, args=(rank, start, steps, seed), timeout=timeout, show_output=False)
        size = world.size
    rows = [{**row, "max_abs_diff": max(r[i]["max_abs_diff"] for r in per_rank),
             "max_abs_grad": max(r[i]["max_abs_grad"] for r in per_rank)} for i, row in enumerate(per_rank[0])]
    compressing = [row for row in rows if row["compressed"]]

    def ratio(key):
        sent = sum(row[key] for row in compressing)
        return sum(row["uncompressed_bytes"] for row in compressing) / sent if sent else None
    return {"model": MODEL, "world_size": size, "rank": rank, "start": start, "steps": steps,
            "bucket_sizes": [b.buffer.numel() for b in build_buckets(build_model(MODEL, device="meta"),
                                                                     SPECS[MODEL].bucket_mb)],
            "compared": ("torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.powerSGD_hook "
                         "(PowerSGDState defaults: min_compression_rate=2, warm_start=True, use_error_feedback=True, "
                         "random_seed=0) against dpteach.sync.powersgd.PowerSGD, per bucket of the course's buckets; "
                         "the averaged gradient of every element on every rank"),
            "rows": rows, "max_abs_diff": max(row["max_abs_diff"] for row in rows),
            "compression_ratio": ratio("course_bytes"), "torch_compression_ratio": ratio("torch_bytes")}
