"""``dpteach train``: one strategy, checkpointed every N steps, resumed from the newest checkpoint if there is one.

Run it again after a crash and it goes on where the last checkpoint left it. Under torchrun with
``--max-restarts``, torchrun does the running again::

    torchrun --standalone --nproc-per-node 2 --max-restarts 1 -m dpteach train --checkpoint ckpt \\
        --every 4 --fault kill@6:1 --json result.json

kills rank 1 before step 6 on the first attempt; torchrun restarts both ranks, which resume from
step 4 and finish. ``--fault`` is there to practise on; ``--leave-out`` to see why each piece of a
checkpoint is needed (``dpteach/training/checkpoint.py``).
"""
from __future__ import annotations

import os
from pathlib import Path

from ..ranks.faults import FAULT_KINDS, Fault, write_json
from ..ranks.launcher import launch
from ..ranks.torchrun import torchrun_sizes, under_torchrun
from ..ranks.world import default_world_size
from ..training.checkpoint import PIECES, RESUMABLE
from ..training.resumable import Checkpointing, check_run, train_resumable_on_rank
from ..training.train import TrainConfig


def add_arguments(parser) -> None:
    parser.add_argument("--world-size", "-w", type=int, default=None,
                        help="number of ranks (default: torchrun's world, else up to 4 on this machine)")
    parser.add_argument("--strategy", default="ddp", help=f"one of {', '.join(RESUMABLE)} (default ddp)")
    parser.add_argument("--model", default="mlp", help="mlp (default), cnn or transformer")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps in all (default 20)")
    parser.add_argument("--batch", type=int, default=None,
                        help="samples per rank per step (default 32); keep batch x ranks the same to resume at another W")
    parser.add_argument("--optimizer", default="sgd", help="sgd or adam")
    parser.add_argument("--precision", default="fp32", help="fp32, bf16 or fp16 (fp16 keeps a loss scale)")
    parser.add_argument("--input-noise", type=float, default=0.0,
                        help="std of Gaussian noise added to each input, drawn from each rank's generator")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", required=True, metavar="DIR", help="folder of the checkpoints")
    parser.add_argument("--every", type=int, default=5, help="checkpoint every N steps (default 5)")
    parser.add_argument("--leave-out", default="", metavar="PIECES",
                        help=f"on resume, do not restore these (comma-separated: {', '.join(PIECES)})")
    parser.add_argument("--fault", default=None, metavar="KIND@STEP[:RANK]",
                        help=f"fail on purpose, on the first attempt only: {', '.join(FAULT_KINDS)}, e.g. kill@6:1")
    parser.add_argument("--json", default=None, metavar="FILE", help="rank 0 writes what happened to FILE")
    parser.add_argument("--weights", default=None, metavar="FILE",
                        help="rank 0 saves the final weights (one float32 vector) to FILE with torch.save")


def run(args) -> int:
    if under_torchrun():
        world_size = torchrun_sizes(args.world_size)[0]
    else:
        world_size = args.world_size or default_world_size()
    config = TrainConfig(strategy=args.strategy, model=args.model, steps=args.steps, batch_per_rank=args.batch,
                         optimizer=args.optimizer, precision=args.precision, input_noise=args.input_noise,
                         seed=args.seed)
    checkpointing = Checkpointing(args.checkpoint, every=args.every,
                                  leave_out=tuple(p.strip() for p in args.leave_out.split(",") if p.strip()))
    fault = Fault.parse(args.fault) if args.fault else None
    check_run(config, checkpointing, fault, world_size)  # before any rank starts
    results = launch(train_resumable_on_rank, None if under_torchrun() else world_size,
                     args=(config, checkpointing, fault))
    if int(os.environ.get("RANK", "0")) != 0 and under_torchrun():
        return 0  # every rank ran; one reports
    first = results[0]
    report = {"strategy": config.strategy, "world_size": world_size, "steps": config.steps,
              "resumed_from": first["resumed_from"], "restarts": first["restarts"], "restored": first["restored"],
              "saved_world_size": first["saved_world_size"], "losses": first["losses"],
              "checkpoints": [c["path"] for c in first["checkpoints"]],
              "checkpoint_seconds": [c["seconds"] for c in first["checkpoints"]],
              "checkpoint_bytes": [c["bytes"] for c in first["checkpoints"]],
              "replicas_identical": all(r["replica_spread"] == 0.0 for r in results)}
    if args.weights:
        import torch
        tmp = Path(args.weights).with_suffix(".tmp")
        torch.save(first["params"], tmp)
        os.replace(tmp, args.weights)
    if args.json:
        write_json(Path(args.json), report)
    resumed = (f" (resumed from the checkpoint of step {first['resumed_from']}, restart {first['restarts']})"
               if first["resumed_from"] else "")
    final = f"; final loss {first['losses'][-1]:.4f}" if first["losses"] else "; nothing left to train"
    print(f"{config.strategy} on {world_size} ranks: steps {first['resumed_from']}..{config.steps} trained here"
          f"{resumed}{final}")
    return 0
