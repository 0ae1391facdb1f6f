"""``dpteach profile [--steps N] [--skip K] [--out DIR] -- COMMAND ...``: record a few steps of every rank of a
training command, unedited, into one folder of per-rank traces (``dpteach.profiling.launch``)."""
from __future__ import annotations

import sys


def add_arguments(parser) -> None:
    parser.add_argument("--out", default="traces", help="folder for the traces, one rank{R}.json per rank "
                                                        "(default: traces; earlier rank*.json there are replaced)")
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps to record on every rank (default 5)")
    parser.add_argument("--skip", type=int, default=3,
                        help="optimizer steps to leave out first, the job's own warm-up (default 3; one more "
                             "step warms the profiler up)")
    parser.add_argument("--timeout", type=float, default=None, help="stop the command after this many seconds")
    parser.add_argument("command", nargs="+", metavar="-- COMMAND",
                        help="the training command as you run it, after --: torchrun ... train.py ...")


def run(args) -> int:
    from ..profiling import profile_command
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        result = profile_command(command, out=args.out, steps=args.steps, skip=args.skip, timeout=args.timeout)
    except RuntimeError as exc:
        print(f"dpteach profile: {exc}", file=sys.stderr)
        return 1
    print(f"{len(result['traces'])} trace(s) in {result['out']}; read them with: dpteach diagnose {args.out}")
    return 0
