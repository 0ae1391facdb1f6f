"""Lesson 17's bar: does `dpteach diagnose` name every planted problem first, with its lesson, raise nothing on the
healthy job, and read a 4-rank job's traces in under 10 s?

    python benchmarks/diagnose_planted.py              # 3 rounds of the six jobs on 4 ranks: results/diagnose_planted_w4_cpu.json
    python benchmarks/diagnose_planted.py --rounds 1

Each round profiles every plant once with `dpteach profile` around torchrun (fresh processes, gloo), as a learner's
job would be, then times `diagnose()` on its folder (reading the four traces included). The plants run in turn
within a round, so a busy moment of the machine falls on all of them alike. The suite runs one round
(tests/test_profiling.py); this repeats it, because on 2 cores a noisy rank is the risk to a healthy job.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.run import RESULTS, machine  # noqa: E402
from dpteach.experiments.diagnosis import EXPECTED  # noqa: E402
from dpteach.profiling import profile_command, torchrun  # noqa: E402
from dpteach.profiling.diagnose import THRESHOLD, diagnose  # noqa: E402
from dpteach.profiling.planted import PLANTS  # noqa: E402

WORLD, STEPS, SKIP = 4, 8, 3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    runs, base = [], Path(tempfile.mkdtemp(prefix="dpteach-diagnose-bench-"))
    for round_ in range(args.rounds):
        for plant in PLANTS:
            folder = base / f"{plant}-{round_}"
            started = time.perf_counter()
            profile_command(torchrun(["-m", "dpteach.profiling.planted", "--plant", plant,
                                      "--steps", str(SKIP + 1 + STEPS + 2)], WORLD),
                            out=str(folder), steps=STEPS, skip=SKIP, quiet=True)
            profiled = time.perf_counter() - started
            started = time.perf_counter()
            result = diagnose(str(folder))
            read = time.perf_counter() - started
            top = result["findings"][0] if result["findings"] else None
            expected = EXPECTED[plant]
            runs.append({"round": round_, "plant": plant, "expected": expected,
                         "top": [top["kind"], top["lesson"]] if top else None,
                         "findings": [[f["kind"], f["lesson"], f["cost"]] for f in result["findings"]],
                         "right": (top is None) if expected is None else (top is not None and
                                                                          (top["kind"], top["lesson"]) == expected),
                         "diagnose_s": round(read, 3), "profile_s": round(profiled, 2),
                         "trace_mib": round(sum(p.stat().st_size for p in folder.glob("rank*.json")) / 2**20, 2)})
            print(f"round {round_} {plant:14s} top={runs[-1]['top']} right={runs[-1]['right']} "
                  f"diagnose {read:.2f} s", flush=True)
    planted = [r for r in runs if r["expected"] is not None]
    healthy = [r for r in runs if r["expected"] is None]
    summary = {"planted_named_first": f"{sum(r['right'] for r in planted)} of {len(planted)}",
               "healthy_false_alarms": sum(len(r["findings"]) > 0 for r in healthy),
               "healthy_runs": len(healthy), "threshold": THRESHOLD,
               "max_diagnose_s": max(r["diagnose_s"] for r in runs),
               "median_diagnose_s": sorted(r["diagnose_s"] for r in runs)[len(runs) // 2]}
    out = {"command": "python benchmarks/diagnose_planted.py --rounds %d" % args.rounds, "machine": machine(),
           "world_size": WORLD, "steps_recorded": STEPS, "skip": SKIP, "summary": summary, "runs": runs}
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"diagnose_planted_w{WORLD}_cpu.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(summary, indent=1), f"\nwritten: {path}")
    return 0 if all(r["right"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
