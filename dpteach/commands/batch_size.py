"""``dpteach batch-size``: how big a batch - the critical batch size and the learning-rate rules, on real ranks.

    dpteach batch-size                           steps to the target at 32 .. 2048, the fit and the noise scale
    dpteach batch-size --batches 32,64,128,256,512,1024,2048,4096 --json
    dpteach batch-size --lr-rules --batches 32,512,4096 --json    fixed, linear and sqrt, with and without warmup
    dpteach batch-size --checkpointing --json    what checkpointing every block saves and costs (one process)

Lesson 15 runs the same experiments (``dpteach.experiments.batch_size``) in panels; this is the command for a
run whose numbers are kept (``benchmarks/run.py``).
"""
from __future__ import annotations

import argparse
import json

from ..experiments.batch_size import TARGET_LOSS, critical_batch, lr_rules
from ..training.batch_rules import run_outcome


def _batches(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--lr-rules", action="store_true",
                      help="compare the learning-rate rules instead of measuring the critical batch")
    mode.add_argument("--checkpointing", action="store_true",
                      help="measure what checkpointing every block saves and costs (mlp, transformer; batch 32)")
    parser.add_argument("--batches", type=_batches, metavar="B,B,...", help="global batches (multiples of -w)")
    parser.add_argument("-w", "--world-size", type=int, default=2, metavar="W", help="ranks (default 2)")
    parser.add_argument("--target-loss", type=float, default=TARGET_LOSS, metavar="L",
                        help=f"the loss each run trains to (default {TARGET_LOSS})")
    parser.add_argument("--max-steps", type=int, metavar="N",
                        help="steps after which a run stops if it has not arrived")
    parser.add_argument("--json", action="store_true", help="print the whole result as JSON")


def run(args) -> int:
    if args.checkpointing:
        return _checkpointing(args.json)
    kwargs = {"world_size": args.world_size, "target_loss": args.target_loss}
    if args.batches:
        kwargs["batches"] = args.batches
    if args.max_steps:
        kwargs["max_steps"] = args.max_steps
    result = lr_rules(**kwargs) if args.lr_rules else critical_batch(**kwargs)
    if args.json:
        print(json.dumps(result))
        return 0
    if args.lr_rules:
        for r in result["rows"]:
            print(f"B={r['batch']:>5}  {r['rule']:<6} warmup {r['warmup_steps']:>2}  lr {r['lr']:<8.4g} "
                  f"{run_outcome(r)}")
        big = result["largest"]
        print(f"largest batch {big['batch']}: linear with warmup "
              + ("took fewer steps than" if big["linear_warmup_beats_fixed"] else "did not take fewer steps than")
              + " the fixed rate")
        return 0
    for r in result["rows"]:
        print(f"B={r['batch']:>5}  best lr {'-' if r['best_lr'] is None else format(r['best_lr'], 'g')}  "
              f"steps to target {r['steps_to_target'] or 'not reached'}")
    fit, noise = result["fit"], result["noise_scale"]
    if fit:
        print(f"fit S = S_min (1 + B_noise / B): S_min {fit['s_min']:.1f}, B_noise {fit['b_noise']:.0f}, "
              f"worst error {fit['worst_error']:.0%}")
    print("B_simple from the ranks' gradients: " + (f"{noise['b_simple']:.0f}" if noise["b_simple"] else "no estimate"))
    return 0


def _checkpointing(as_json: bool) -> int:
    from ..experiments.activations import checkpointing
    from ..widgets.rendering import human_bytes
    result = checkpointing()
    if as_json:
        print(json.dumps(result))
        return 0
    for r in result["rows"]:
        ratio, predicted = r["ratio"], r["predicted"]
        print(f"{r['model']:<12} {r['blocks']} blocks: kept for backward {human_bytes(r['saved_bytes'])} -> "
              f"{human_bytes(r['checkpointed_saved_bytes'])} ({r['share_saved']:.0%} saved); step "
              f"{ratio['median']:.2f}x ({ratio['low']:.2f}-{ratio['high']:.2f}) as long, one more forward predicts "
              f"{predicted['median']:.2f}x ({predicted['low']:.2f}-{predicted['high']:.2f}): "
              f"{r['versus_prediction']} the prediction")
    return 0
