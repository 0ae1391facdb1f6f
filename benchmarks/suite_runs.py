"""The whole suite as CI runs it: a fresh clone of a commit, ``.ci/run`` in it (which installs everything into a new
``.venv`` and runs the README's test command), timed; each run appended to ``results/suite_runs.json``.

    python benchmarks/suite_runs.py                  # HEAD, once
    python benchmarks/suite_runs.py --runs 3         # three runs in a row, each on a fresh clone
    python benchmarks/suite_runs.py --random-order   # once more, with the tests in a random order (pytest-randomly)

The bar (issue "a suite that says the truth every time"): 0 failures in each of three runs, pytest within 30
minutes in each. ``pytest_s`` is pytest's own clock (its summary line); ``wall_s`` adds the install. The clone is
made from this repository's commit with ``git clone --no-local`` (nothing of this checkout's ignored files, build
outputs or virtual environment comes along) and removed afterwards unless ``--keep``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "suite_runs.json"
SUMMARY = re.compile(r"=+ (.*?) in ([\d.]+)s")


def summary(output: str) -> dict:
    """pytest's last summary line: the counts by outcome and its seconds."""
    found = SUMMARY.findall(output)
    if not found:
        return {"pytest_s": None}
    counts, seconds = found[-1]
    parsed = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)", counts)}
    return {"pytest_s": float(seconds), "passed": parsed.get("passed", 0), "failed": parsed.get("failed", 0),
            "errors": parsed.get("error", 0) + parsed.get("errors", 0), "skipped": parsed.get("skipped", 0)}


def run_once(commit: str, random_order: bool, keep: bool, log_folder: Path) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="dpteach-suite-"))
    clone = folder / "dpteach"
    subprocess.run(["git", "clone", "--quiet", "--no-local", str(ROOT), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "--quiet", commit], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "DPTEACH_PROGRESS")}
    env.pop("PYTEST_ORDER", None)
    if random_order:  # the Makefile switches pytest-randomly off unless PYTEST_ORDER says otherwise (here: nothing)
        env["PYTEST_ORDER"] = ""
    started = time.time()
    log_path = log_folder / f"suite-{commit[:10]}-{int(started)}.log"
    with open(log_path, "w") as log:
        done = subprocess.run([str(clone / ".ci" / "run")], cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT)
    wall = time.time() - started
    output = log_path.read_text(errors="replace")
    seed = re.search(r"Using --randomly-seed=(\d+)", output)
    if not keep:
        shutil.rmtree(folder, ignore_errors=True)
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.M)
    return {"commit": commit, "exit_code": done.returncode, "wall_s": round(wall, 1), **summary(output),
            "random_order": random_order, "random_seed": int(seed.group(1)) if seed else None,
            "failures": failed, "log": log_path.name, "started": time.strftime("%Y-%m-%d %H:%M:%S",
                                                                             time.gmtime(started))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--commit", default="HEAD")
    parser.add_argument("--random-order", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep each clone (and its .venv) afterwards")
    parser.add_argument("--logs", default=tempfile.gettempdir(), help="where each run's whole output goes")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, not {args.runs}")
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", args.commit], capture_output=True, text=True,
                            check=True).stdout.strip()
    for number in range(args.runs):
        run = run_once(commit, args.random_order, args.keep, Path(args.logs))
        record = json.loads(RESULTS.read_text()) if RESULTS.exists() else {
            "command": "python benchmarks/suite_runs.py", "bar_s": 1800, "runs": []}
        record["runs"].append(run)
        RESULTS.with_suffix(".tmp").write_text(json.dumps(record, indent=1) + "\n")
        os.replace(RESULTS.with_suffix(".tmp"), RESULTS)
        print(f"run {number + 1}/{args.runs} of {commit[:10]}: {run['passed']} passed, {run['failed']} failed, "
              f"pytest {run['pytest_s']} s, wall {run['wall_s']} s{' (random order)' if args.random_order else ''}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
