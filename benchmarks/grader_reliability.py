"""How often does the grader misjudge an honest hook? Exercise 04's correct solutions, graded many times each.

    python benchmarks/grader_reliability.py             # 40 gradings, writes results/grader_reliability_ex04.json
    python benchmarks/grader_reliability.py --each 10   # ten of every style

Exercise 04 is where timing could mislead a grader: an overlap hook may wait on works, futures, chained
``.then()`` callbacks or polling, and gloo marks a work's future done a moment before the work reports itself
completed. Every style in ``tests/learners/overlap.py`` is correct, so every grading must give full marks. The
default, ten gradings of the plain ``work.wait()`` hook and five of each other style (40 in all), catches a
grader that misjudges an honest hook one time in twenty with probability 1 - 0.95^40, about 87%. The suite
grades each style once (``tests/test_grading_overlap.py``); this is the repeated measurement, kept out of it
because it costs minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from benchmarks.run import RESULTS, machine  # noqa: E402
from dpteach.grading import get_exercise, grade_sources  # noqa: E402
from learners.overlap import STYLES, style  # noqa: E402

DEFAULT_EACH, PLAIN, PLAIN_EACH = 5, "work.wait()", 10


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--each", type=int, default=None,
                        help=f"gradings of every style (default: {PLAIN_EACH} of {PLAIN!r}, {DEFAULT_EACH} of the others)")
    args = parser.parse_args(argv)
    if args.each is not None and args.each < 1:
        parser.error(f"--each {args.each} is not allowed: grade every style at least once")
    counts = {name: args.each or (PLAIN_EACH if name == PLAIN else DEFAULT_EACH) for name in sorted(STYLES)}
    names = [name for name, n in counts.items() for _ in range(n)]
    started = time.perf_counter()
    reports = grade_sources("04", [(style(name), None) for name in names])
    full = get_exercise("04").max_score
    rows = {name: {"gradings": n, "full_marks": 0, "lost": []} for name, n in counts.items()}
    for name, report in zip(names, reports):
        if report.score == full:
            rows[name]["full_marks"] += 1
        else:
            rows[name]["lost"].append([row.name for row in report.checks if not row.passed])
    total = sum(r["gradings"] for r in rows.values())
    misjudged = total - sum(r["full_marks"] for r in rows.values())
    result = {"command": "benchmarks/grader_reliability.py" + (f" --each {args.each}" if args.each else ""),
              "machine": machine(), "exercise": "04", "gradings": total, "misjudged": misjudged,
              "seconds": round(time.perf_counter() - started, 1), "styles": rows}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "grader_reliability_ex04.json").write_text(json.dumps(result, indent=1) + "\n")
    for name, row in rows.items():
        print(f"{row['full_marks']:>3} of {row['gradings']:<3} full marks  {name}")
    print(f"{misjudged} of {total} gradings misjudged an honest hook ({result['seconds']} s)")
    return 0 if misjudged == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
