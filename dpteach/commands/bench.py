"""``dpteach bench allreduce``: the all-reduce sweep (algbw and busbw as in nccl-tests), as a table or as JSON."""
from __future__ import annotations

import json

from ..experiments.bench import ALGORITHMS, allreduce_benchmark, parse_size
from ..network.costmodel import busbw_factor
from ..ranks import context


def add_arguments(parser) -> None:
    parser.add_argument("what", choices=["allreduce"], help="the collective to measure")
    parser.add_argument("--world-size", "-w", type=int, default=None,
                        help="number of ranks (default: torchrun's world, else up to 4 on this machine)")
    parser.add_argument("--sizes", default="4KiB,1MiB,16MiB", help="comma-separated message sizes")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS),
                        help=f"comma-separated subset of {','.join(ALGORITHMS)}")
    parser.add_argument("--iters", type=int, default=10, help="timed iterations per point")
    parser.add_argument("--warmup", type=int, default=2, help="untimed iterations per point")
    parser.add_argument("--pieces", type=int, default=1, help="pipelining pieces per ring step (1 = plain ring)")
    parser.add_argument("--backend", default="auto", help="auto, gloo or nccl")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    report = allreduce_benchmark(args.world_size, sizes, algorithms, iters=args.iters, warmup=args.warmup,
                                 pieces=args.pieces, backend=args.backend)
    if context.rank() != 0:
        return 0  # under torchrun every rank ran the benchmark; one of them reports it
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"# all-reduce, {report['world_size']} ranks, backend {report['backend']}, device {report['device']}"
          f" (busbw = algbw x {busbw_factor(report['world_size']):.3f})")
    print(f"{'bytes':>12} {'algorithm':>9} {'time (us)':>11} {'algbw GB/s':>11} {'busbw GB/s':>11}")
    for row in report["rows"]:
        print(f"{row['bytes']:>12} {row['algorithm']:>9} {row['time_s'] * 1e6:>11.1f} "
              f"{row['algbw_GBps']:>11.3f} {row['busbw_GBps']:>11.3f}")
    fit = report.get("fit")
    if fit:
        print(f"# alpha-beta fit to the ring: alpha = {fit['alpha_s'] * 1e6:.1f} us, "
              f"beta = {fit['beta_s_per_byte'] * 1e9:.3f} ns/B ({fit['bandwidth_GBps']:.2f} GB/s), R^2 = {fit['r2']:.3f}")
    return 0
