"""``dpteach compare``: every gradient-sync strategy on one model, measured in one run."""
from __future__ import annotations

import argparse
import json

from ..experiments.compare import DEFAULT_STRATEGIES, compare_strategies
from ..network.link import PRESETS
from ..ranks import context
from ..ranks.world import PEERS
from ..replica.models import model_names
from ..replica.sizing import describe_choice
from ..sync import all_knobs
from ..training.train import ALL_REDUCE_CHOICES

COLUMNS = ("strategy", "knobs", "all_reduce", "step_time_s", "mean_step_time_s", "steps_to_target", "time_to_target_s", "exposed_comm_s", "exposed_how", "overhead_s", "overhead_parts",
           "bytes_per_step", "bytes_per_step_whole_run", "bytes_counted_from_step", "final_loss", "max_abs_diff_vs_single", "exact", "replicas_identical",
           "state_bytes_per_rank", "peak_bytes_per_rank", "allocator_peak_bytes_per_rank", "link_report",
           "comm_s_per_rank", "time_to_target_spread_s", "quantisation", "largest_step_bytes")
# on a two-level link (``--link inside/between``): bytes per step and rank on each level, counted and measured
LEVEL_COLUMNS = ("bytes_between_per_step", "bytes_inside_per_step", "received_between_per_step",
                 "received_inside_per_step")


def add_arguments(parser) -> None:
    parser.add_argument("--world-size", "-w", type=int, default=None,
                        help="number of ranks (default: torchrun's world, else up to 4 on this machine)")
    parser.add_argument("--model", default="auto",
                        help=f"auto (the default: the MLP on CPU ranks, a GPU-sized transformer on GPU ranks, fitted "
                             f"to the GPU), or one of {', '.join(model_names())}")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per strategy (default 20)")
    parser.add_argument("--accum", type=int, default=1, help="micro-batches per step (gradient accumulation)")
    parser.add_argument("--bucket-mb", type=float, default=None,
                        help="bucket size cap in MiB (default: the model's, 1 for mlp and cnn, 0.25 for transformer)")
    parser.add_argument("--batch", type=int, default=None,
                        help="samples per rank per micro-batch (default: 32 for the laptop models, the model's own "
                             "for a GPU-sized one)")
    parser.add_argument("--peers", default="real", choices=PEERS,
                        help="real ranks (the default), or emulated: one real rank whose exchange the --link times "
                             "as among --world-size ranks (one GPU showing the timing of many; no exactness shown)")
    parser.add_argument("--optimizer", default="sgd", help="sgd or adam")
    parser.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES),
                        help="comma-separated strategies (local is the compute floor); NAME@N sets a strategy's "
                             "main knob: powersgd@16 (rank 16), local_sgd@32 or diloco@32 (32 steps between averages)")
    add_knob_flags(parser)
    parser.add_argument("--target-loss", type=float, default=None,
                        help="the loss each strategy's time to target is measured to (default: read from the "
                             "single-process reference's curve; the output states it)")
    parser.add_argument("--backend", default="auto", help="auto, gloo or nccl")
    parser.add_argument("--link", default=None, metavar="NAME",
                        help=f"emulate a network for every collective: {', '.join(PRESETS)} (default: none)")
    parser.add_argument("--link-alpha", type=float, default=None, metavar="S",
                        help="a custom emulated link's latency per message, in seconds (with --link-beta)")
    parser.add_argument("--link-beta", type=float, default=None, metavar="S_PER_BYTE",
                        help="a custom emulated link's seconds per byte, 1 / bandwidth (with --link-alpha)")
    parser.add_argument("--all-reduce", default="builtin", choices=ALL_REDUCE_CHOICES,
                        help="the collectives to run: torch's (builtin, the default) or the course's own from "
                             "dpteach/collectives - naive and bucketed all-reduce on its ring or tree, zero1-3 "
                             "reduce-scatter and all-gather on its ring; the other strategies keep torch's")
    parser.add_argument("--sequential", action="store_true",
                        help="run the strategies one after another instead of step by step side by side")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--trace", default=None, metavar="FILE",
                        help="also write every rank's timeline of every strategy to FILE, a trace that "
                             "ui.perfetto.dev and chrome://tracing open (one process per rank)")


def add_knob_flags(parser) -> None:
    """One flag per strategy knob, made from its declaration (``sync/knobs.py``): ``--sync-every`` sets
    ``sync_every`` for every strategy that takes it. Left out, a knob keeps its strategy's default."""
    for name, (knob, owners) in all_knobs().items():
        default = "None" if knob.default is None else f"{knob.default}"
        extra = ({"action": argparse.BooleanOptionalAction} if knob.kind is bool else
                 {"type": knob.kind, "metavar": knob.name.upper()})
        parser.add_argument(knob.flag, dest=f"knob_{name}", default=None,
                            help=f"{', '.join(owners)}: {knob.help} (default {default})", **extra)


def given_knobs(args) -> dict:
    """The knobs the command line set: {name: value}, the strategies' defaults left out."""
    return {name: getattr(args, f"knob_{name}") for name in all_knobs() if getattr(args, f"knob_{name}") is not None}


def _link(args):
    custom = (args.link_alpha, args.link_beta)
    if custom == (None, None):
        return args.link
    if None in custom or args.link is not None:
        raise ValueError(f"--link {args.link!r} --link-alpha {args.link_alpha!r} --link-beta {args.link_beta!r} "
                         f"is not allowed: give --link NAME, or both --link-alpha and --link-beta, not a mix")
    return {"name": "custom", "alpha_s": args.link_alpha, "beta_s_per_byte": args.link_beta}


def split_strategies(text: str) -> list[str]:
    """``"ddp,zeropp(qwz=False,qgz=False)"`` -> ``["ddp", "zeropp(qwz=False,qgz=False)"]``: commas inside a
    variant's parentheses separate its knobs, not strategies."""
    names, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            names.append(current.strip())
            current = ""
        else:
            current += char
    return [name for name in names + [current.strip()] if name]


def run(args) -> int:
    strategies = split_strategies(args.strategies)
    report = compare_strategies(args.world_size, model=args.model, steps=args.steps, accum_steps=args.accum,
                                bucket_mb=args.bucket_mb, strategies=strategies, optimizer=args.optimizer,
                                backend=args.backend, batch_per_rank=args.batch, interleave=not args.sequential,
                                link=_link(args), all_reduce=args.all_reduce, peers=args.peers, trace=args.trace,
                                target_loss=args.target_loss, knobs=given_knobs(args))
    if context.rank() != 0:
        return 0  # under torchrun every rank ran the experiment; one of them reports it
    rows = [{k: row[k] for k in COLUMNS + LEVEL_COLUMNS if k in row} for row in report["rows"]]
    if args.json:
        keys = ("world_size", "real_ranks", "peers", "peers_note", "backend", "device", "model", "model_choice",
                "steps", "accum_steps", "bucket_mb", "batch_per_rank", "optimizer", "link", "all_reduce", "tolerance",
                "left_out", "target_loss", "target_rule", "target_window")
        print(json.dumps({**{k: report[k] for k in keys}, "rows": rows}, indent=2))
        return 0
    print(f"# {report['model']} on {report['world_size']} ranks ({report['backend']}, {report['device']}), "
          f"{report['steps']} steps, accumulation {report['accum_steps']}, buckets {report['bucket_mb']} MB, "
          f"batch {report['batch_per_rank']} per rank")
    print(f"# {describe_choice(report['model_choice'])}")
    if report["peers_note"]:
        print(f"# {report['peers_note']}")
    for name, why in report["left_out"].items():
        print(f"# left out: {name} ({why})")
    if report["link"]:
        link = report["link"]
        print(f"# emulated link {link['name']}: {link['alpha_s'] * 1e6:g} us per message, "
              f"{1 / link['beta_s_per_byte'] / 1e9 if link['beta_s_per_byte'] else float('inf'):g} GB/s; "
              f"'set by' says whether the link or this machine set the time of most messages")
    if report["all_reduce"] != "builtin":
        print(f"# the course's own {report['all_reduce']} (dpteach/collectives) where a strategy takes it "
              f"(see the all-reduce column); the other strategies with torch's")
    if report["target_loss"] is not None:
        print(f"# target loss {report['target_loss']:.4f}: {report['target_rule']}; 'to target' is the time of the "
              f"measured steps until then ('-': not reached in {report['steps']} steps)")
    width = max(len("strategy"), *(len(r["strategy"]) for r in rows))
    print(f"{'strategy':>{width}} {'all-reduce':>10} {'step ms':>8} {'exposed ms':>10} {'overhead ms':>11} "
          f"{'MB/step':>8} {'final loss':>10} {'max|dθ| vs 1 proc':>17} {'replicas equal':>14} {'state MB':>8} "
          f"{'peak MB':>8} {'to target':>9}" + (f" {'set by':>8}" if report["link"] else ""))
    ms = lambda seconds: "-" if seconds is None else f"{seconds * 1e3:.1f}"  # noqa: E731
    to_target = lambda r: "-" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.2f} s"  # noqa: E731
    for r in rows:
        exposed = ms(r["exposed_comm_s"]) + ("*" if r["exposed_how"] != "measured wait" else "")
        diff = "-" if r["max_abs_diff_vs_single"] is None else f"{r['max_abs_diff_vs_single']:.2e}"
        set_by = (r["link_report"] or {}).get("time_set_by", "-") if report["link"] else None
        print(f"{r['strategy']:>{width}} {r['all_reduce']:>10} {r['step_time_s'] * 1e3:>8.1f} {exposed:>10} "
              f"{ms(r['overhead_s']):>11} {r['bytes_per_step'] / 2**20:>8.2f} {r['final_loss']:>10.4f} {diff:>17} "
              f"{str(r['replicas_identical']):>14} {r['state_bytes_per_rank'] / 2**20:>8.2f} "
              f"{r['peak_bytes_per_rank'] / 2**20:>8.2f} {to_target(r):>9}" + (f" {set_by:>8}" if set_by else ""))
    if any("bytes_between_per_step" in r for r in rows):
        print("# bytes per rank and step on each level: counted by the course's Comm; received = what the kernel "
              "counted on the gloo sockets (only strategies that keep their own groups: hsdp, zeropp)")
        mb = lambda n: "-" if n is None else f"{n / 2**20:.2f}"  # noqa: E731
        for r in rows:
            print(f"{r['strategy']:>{width}}  across nodes {mb(r['bytes_between_per_step']):>7} MB (received "
                  f"{mb(r['received_between_per_step'])})  inside {mb(r['bytes_inside_per_step']):>7} MB (received "
                  f"{mb(r['received_inside_per_step'])})")
    print("exposed = the time the ranks waited for communication, measured where they waited (* fsdp: step time "
          "minus 'local', FSDP2 waits inside torch); overhead = the rest of the step above 'local' (no "
          "communication): packing and unpacking buckets, compressing, launching, compute slowed by communication")
    print("state = parameters, gradients and optimizer state a rank holds when its optimizer steps; "
          "peak adds the transient buffers (unsharded parameters, buckets) alive at once")
    if report["peers"] == "real":
        print(f"the exact strategies ({', '.join(r['strategy'] for r in rows if r['exact'])}) must end within "
              f"{report['tolerance']:.0e} of one process's weights")
    return 0
