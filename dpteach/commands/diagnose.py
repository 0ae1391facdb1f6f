"""``dpteach diagnose TRACE_DIR``: what slows the job whose per-rank traces are in TRACE_DIR, each finding with
the lesson that explains it (``dpteach.profiling.diagnose``); ``--merge`` writes one trace of all ranks."""
from __future__ import annotations

import json


def add_arguments(parser) -> None:
    parser.add_argument("trace_dir", metavar="TRACE_DIR", help="the folder `dpteach profile --out` wrote")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--merge", nargs="?", const="", default=None, metavar="FILE",
                        help="also write every rank in one trace for Perfetto or chrome://tracing "
                             "(default TRACE_DIR/merged.json)")


def run(args) -> int:
    from ..profiling.diagnose import diagnose, report
    from ..profiling.merge import merge_traces
    result = diagnose(args.trace_dir)
    if args.merge is not None:
        result["merged"] = merge_traces(args.trace_dir, args.merge or None)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(report(result))
        if "merged" in result:
            print(f"\nAll ranks in one trace: {result['merged']} (open it at https://ui.perfetto.dev or chrome://tracing)")
    return 0
