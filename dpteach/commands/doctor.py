"""``dpteach doctor``: what this machine offers, which backend the course will use, and a smoke test."""
from __future__ import annotations

import json
import time

import torch
import torch.distributed as dist

from ..ranks.backend import visible_gpus


def add_arguments(parser) -> None:
    parser.add_argument("--world-size", "-w", type=int, default=2, help="ranks for the smoke test (default 2)")
    parser.add_argument("--no-smoke", action="store_true", help="skip the all-reduce smoke test")
    parser.add_argument("--gpu", action="store_true",
                        help="exercise every CUDA path one GPU allows (a few minutes) and print the measurements")
    parser.add_argument("--full", action="store_true",
                        help="the same checks on whatever this machine has: the GPU if there is one, else the CPU")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _smoke(n: int) -> dict:
    """Each rank contributes rank+1; the built-in and the ring all-reduce must both give W(W+1)/2."""
    from ..ranks import context
    from ..collectives import ring_all_reduce
    world = dist.get_world_size()
    expected = world * (world + 1) / 2
    out = {}
    for name in ("builtin", "ring"):
        x = torch.full((n,), float(dist.get_rank() + 1), device=context.device())
        start = time.perf_counter()
        dist.all_reduce(x) if name == "builtin" else ring_all_reduce(x)
        context.synchronize()
        out[name] = {"ok": bool(torch.all(x == expected)), "seconds": time.perf_counter() - start}
    return out


def machine_report(world_size: int = 2, smoke: bool = True) -> dict:
    """Lesson 00's description of this machine, and the smoke test run in the world it names."""
    from ..experiments.machine import describe_machine
    from ..experiments.on_this_machine import machine_facts
    from ..ranks.world import resolve_world
    world = resolve_world(world_size)
    report = describe_machine(world)
    report["here"] = machine_facts()  # the GPUs' facts, and what each lesson will show on them
    if smoke:
        from ..ranks.launcher import launch
        start = time.perf_counter()
        results = launch(_smoke, world, args=(1024,), timeout=120, show_output=False)
        report["smoke"] = {"ok": all(r[a]["ok"] for r in results for a in r),
                           "launch_and_run_s": time.perf_counter() - start, "per_rank": results}
    return report


def _print_device_report(report: dict) -> None:
    from ..devicecheck.verdict import training_tables
    where = f"GPU {report['gpu']}" if report["gpu"] else "CPU"
    verdict = "all passed" if report["ok"] else f"{len(report['failed'])} FAILED"
    print(f"{where}, torch {report['torch']}: {report['checks']} checks, {verdict} in {report['seconds']:.0f} s")
    for name in report["failed"]:
        print(f"  FAILED {name}")
    for line in report.get("unavailable", []):
        print(f"  NOT COVERED {line}")
    for world in report["worlds"]:
        head = f"  {world['label']} ({world['backend']}, {world['world_size']} rank(s) on {world['device']})"
        if world.get("unavailable"):
            print(f"{head}: could not form - see above")
            continue
        caveat = "  [correctness only: these timings mean nothing]" if not world.get("timings_meaningful", True) else ""
        print(f"{head}: {len(world['collectives']) - 1} collective checks{caveat}")
        if "failure" in world:
            f = world["failure"]
            print(f"    a failing rank: rank {f['rank']} reported {'with' if f['reported'] else 'WITHOUT'} its error "
                  f"after {f['seconds']:.1f} s")
        if world.get("scope", "full") != "full":
            continue
        for row in world["bench"]["rows"]:
            print(f"    all-reduce {row['algorithm']:>8} {row['bytes']:>10} B  {row['time_s'] * 1e6:9.1f} us  "
                  f"busbw {row['busbw_GBps']:.2f} GB/s")
        for key, table in training_tables(world).items():
            for row in table["rows"]:
                print(f"    {key:<12} {row['strategy']:>13}  step {row['step_time_s'] * 1e3:7.2f} ms  "
                      f"max|dθ| vs one process {row['max_abs_diff_vs_single']:.1e}")
        for row in world["bitwise"]["rows"]:
            print(f"    {'bitwise':<12} {row['strategy']:>13}  vs {row['reference']:<12} weights that differ: "
                  f"{row['differing']:,} of {world['bitwise']['num_params']:,}")


def run(args) -> int:
    if args.gpu or args.full:
        from ..devicecheck.run import run_device_checks
        device = "cuda" if args.gpu or visible_gpus() else "cpu"
        report = run_device_checks(device)
        print(json.dumps(report, indent=2, default=str)) if args.json else _print_device_report(report)
        return 0 if report["ok"] else 1
    report = machine_report(args.world_size, smoke=not args.no_smoke)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"python {report['python']}, torch {report['torch']} (CUDA {report['cuda'] or 'none'})")
        print(f"CPUs: {report['cpus']}    GPUs: {len(report['gpus'])} {', '.join(report['gpus'])}")
        print(f"backends: gloo {'yes' if report['gloo'] else 'no'}, nccl {'yes' if report['nccl'] else 'no'}")
        p = report["placement"]
        print(f"with {p['world_size']} ranks the course uses {p['backend']} on {p['device']}")
        from ..experiments.on_this_machine import print_facts
        print_facts(report["here"])
        if "smoke" in report:
            s = report["smoke"]
            print(f"smoke test ({p['world_size']} ranks, built-in and ring all-reduce): "
                  f"{'OK' if s['ok'] else 'FAILED'} in {s['launch_and_run_s']:.1f} s (process start-up included)")
    return 0 if report.get("smoke", {}).get("ok", True) else 1
