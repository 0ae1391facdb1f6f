"""Plots and tables for what DDP and the data really do: lessons 02 (a mismatched collective),
03 (DDP's own buckets, unused parameters, bucket views) and 08 (a forgotten sampler, uneven inputs)."""
from __future__ import annotations

from ..measure import spread
from .rendering import human_bytes, show, table


_COLOURS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")


def _yes(flag) -> str:
    return "-" if flag is None else ("yes" if flag else "no")


# -- lesson 03: DDP's buckets --------------------------------------------------------------------

def plot_ddp_buckets(result: dict):
    """One row per iteration of DDP plus the course's rule: each bucket a segment, in launch order."""
    import matplotlib.pyplot as plt
    rows = [(f"DDP, iteration {it['iteration']}", it["buckets"]) for it in result["iterations"]]
    rows.append(("course rule\n(dpteach/replica/buckets.py)", result["course_rule"]))
    fig, ax = plt.subplots(figsize=(10, 0.7 * len(rows) + 1.8))
    for y, (_, buckets) in enumerate(rows):
        left = 0.0
        for i, bucket in enumerate(buckets):
            width = bucket["bytes"] / 2**20
            ax.barh(y, width, left=left, color=_COLOURS[i % len(_COLOURS)], edgecolor="white")
            ax.text(left + width / 2, y, f"{len(bucket['params'])}", ha="center", va="center", color="white",
                    fontsize="small", fontweight="bold")
            left += width
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("MiB of gradients, buckets in launch order (the number: parameters in the bucket)")
    cap = "default 25 MiB, first 1 MiB" if result["bucket_cap_mb"] is None else f"{result['bucket_cap_mb']:g} MiB"
    ax.set_title(f"{result['model']}: buckets of torch's DDP (bucket_cap_mb: {cap}, "
                 f"find_unused_parameters={result['find_unused_parameters']})", fontsize="medium")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def render_ddp_buckets(result: dict) -> None:
    table(["iteration", "buckets (MiB each, launch order)", "collectives issued"],
          [[it["iteration"], ", ".join(f"{b['bytes'] / 2**20:.2f}" for b in it["buckets"]),
            ", ".join(it["collectives"]) or "none"] for it in result["iterations"]])
    last = result["iterations"][-1]["buckets"]
    print("\nDDP's last iteration, bucket by bucket: " +
          "; ".join(f"[{b['index']}] {', '.join(b['params'])}" for b in last))
    print(f"course rule with the same caps: {'the same buckets' if result['same_as_course_rule'] else 'different'}")
    show(plot_ddp_buckets(result))


# -- lesson 03: unused parameters and bucket views -----------------------------------------------

def render_unused(result: dict) -> None:
    default = result["default"]
    print(f"Default DDP with a spare head: the first backward issued "
          f"{len(default['first_collectives'])} collective(s); the ranks' gradients then differed by up to "
          f"{default['first_grad_spread']:.2g}.\nThe second iteration raised: {default['error'] or 'nothing'}\n")
    base = next(r for r in result["rows"] if r["setting"] == "no spare head")["median_step_s"]
    table(["setting", "collectives in steps 1, 2, 3 and the last", "step, ms: median (interval)",
           "median vs no spare head", "spare head's grads stay None", "replicas identical"],
          [[r["setting"], ", ".join(map(str, r["collectives_per_step"])), spread(r["step"]["samples"]).scaled(1e3).text("", 2),
            f"{r['median_step_s'] / base:.2f}x", _yes(r["spare_grads_none"]), _yes(r["replica_spread"] == 0.0)]
           for r in result["rows"]])
    print(result["ranking"]["sentence"])


def render_bucket_views(result: dict) -> None:
    table(["gradient_as_bucket_view", ".grad tensors", "DDP's buckets", "memory they occupy",
           ".grad tensors inside a bucket"],
          [[str(r["gradient_as_bucket_view"]), human_bytes(r["grad_bytes"]), human_bytes(r["bucket_bytes"]),
            human_bytes(r["distinct_bytes"]), f"{r['grads_in_buckets']} of {r['num_grads']}"]
           for r in result["rows"]])


# -- lesson 08: sampler and uneven inputs ---------------------------------------------------------

def render_sampler(result: dict) -> None:
    b = result["batch_per_rank"]
    for row in result["rows"]:
        print(f"{row['loader']}: first batch of each rank in epoch 0")
        for rank, epochs in row["order"].items():
            print(f"  rank {rank}: {epochs[0][:b]}")
    print()
    table(["loader", "steps per epoch", "distinct samples in step 1", "visits per sample per epoch",
           "shards disjoint", "largest gradient gap between ranks"],
          [[r["loader"], r["steps_per_epoch"], r["distinct_in_first_step"], f"{r['visits_per_sample']:g}",
            _yes(r["shards_disjoint"]), f"{r['grad_spread']:.2g}"] for r in result["rows"]])


def render_uneven(result: dict) -> None:
    plain = result["plain"]
    print(f"batches per rank: {result['batches_by_rank']}; plain loop: {plain['outcome']} after "
          f"{plain['seconds']:.1f} s")
    for rank, where in sorted(plain["where"].items()):
        print(f"  rank {rank} was last at: {where}")
    if plain["message"]:
        print(f"  {plain['message']}")
    print()
    table(["fix", "steps per rank", "replicas identical afterwards"],
          [[f["mode"], ", ".join(map(str, f["steps_by_rank"])), _yes(f["replica_spread"] == 0.0)]
           for f in result["fixes"]])


# -- lesson 02: a mismatched collective -----------------------------------------------------------

def render_mismatch(result: dict) -> None:
    print(f"{result['world_size']} ranks on {result['backend']}; elements each rank all-reduces: "
          f"{result['numel_per_rank']}\n")
    for row in result["rows"]:
        who = "" if row["rank"] is None else f" (rank {row['rank']} first)"
        print(f"TORCH_DISTRIBUTED_DEBUG={row['debug']}: {row['outcome']}{who} after {row['seconds']:.1f} s")
        if row["message"]:
            print(f"    {row['message']}")
