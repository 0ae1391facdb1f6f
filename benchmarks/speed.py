"""How long a learner waits: grading each exercise's reference solution, and each lesson under the clients
learners use to run notebooks from a terminal.

    .venv/bin/python benchmarks/speed.py                     # writes results/speed_cpu.json
    .venv/bin/python benchmarks/speed.py --grades 5 --runs 3 # the defaults

* **Grading.** Each exercise's reference solution is put into a copy of its notebook and graded with
  ``dpteach grade NOTEBOOK --json``, ``--grades`` times in a row: the wall time of the command (the
  interpreter's start-up included) and the grader's own clock (``elapsed_s`` in the report). Medians.
* **Notebooks.** Each lesson runs top to bottom ``--runs`` times under ``jupyter execute`` (nbclient) and,
  when it is installed (``pip install papermill``), under papermill. For every run: its wall time, and
  whether the client stalled - whether a cell's reply reached the client much later than the kernel
  sent it. The executed notebook's timing metadata carries the kernel's stamps; a gap of more than
  ``STALL_S`` between one cell's reply and the next cell's start is a stall (both are kernel stamps, so
  the client's waiting shows as the gap between them).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import RESULTS, machine  # noqa: E402

BIN = Path(sys.executable).parent
STALL_S = 20.0
ENV = {**os.environ, "DPTEACH_GPUS": "0", "CUDA_VISIBLE_DEVICES": ""}


def grading_times(repeats: int) -> list[dict]:
    sys.path.insert(0, str(ROOT / "tests"))  # the answer keys are test material, not part of the package
    from answers.solutions import solution
    from dpteach.grading.spec import all_exercises
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        env = {**ENV, "DPTEACH_PROGRESS": os.path.join(folder, "progress.json")}
        for exercise in all_exercises():
            notebook = json.loads((ROOT / "exercises" / exercise.notebook_name).read_text())
            for cell in notebook["cells"]:
                if "solution" in cell["metadata"].get("tags", []):
                    cell["source"] = solution(exercise.id)
            path = Path(folder) / exercise.notebook_name
            path.write_text(json.dumps(notebook))
            walls, clocks, scores = [], [], []
            for _ in range(repeats):
                started = time.perf_counter()
                done = subprocess.run([str(BIN / "dpteach"), "grade", str(path), "--json"], capture_output=True,
                                      text=True, env=env, timeout=600)
                walls.append(time.perf_counter() - started)
                report = json.loads(done.stdout)
                clocks.append(report["elapsed_s"])
                scores.append(f"{report['score']}/{report['max_score']}")
            rows.append({"exercise": exercise.stem, "cli_s": [round(t, 2) for t in walls],
                         "grader_s": [round(t, 2) for t in clocks], "median_cli_s": round(statistics.median(walls), 2),
                         "median_grader_s": round(statistics.median(clocks), 2), "scores": scores})
            print(f"grade {exercise.stem}: median {rows[-1]['median_grader_s']} s (grader), "
                  f"{rows[-1]['median_cli_s']} s (CLI); scores {set(scores)}", flush=True)
    return rows


def _stalls(executed: Path) -> list[str]:
    cells = [c for c in json.loads(executed.read_text())["cells"] if c["cell_type"] == "code"]
    stamps = [c.get("metadata", {}).get("execution", {}) for c in cells]
    found = []
    for index in range(1, len(stamps)):
        replied, started = stamps[index - 1].get("shell.execute_reply"), stamps[index].get("iopub.execute_input")
        if replied and started:
            gap = datetime.fromisoformat(started).timestamp() - datetime.fromisoformat(replied).timestamp()
            if gap > STALL_S:
                found.append(f"after code cell {index - 1}: {gap:.0f} s between its reply and the next cell")
    return found


def notebook_times(runs: int) -> list[dict]:
    clients = {"jupyter execute": lambda src, dst: [str(BIN / "jupyter"), "execute", "--timeout=600",
                                                    f"--output={dst}", str(src)]}
    if shutil.which("papermill", path=str(BIN)):
        clients["papermill"] = lambda src, dst: [str(BIN / "papermill"), "--cwd", str(src.parent), "--log-level",
                                                 "WARNING", str(src), str(dst)]
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        env = {**ENV, "DPTEACH_PROGRESS": os.path.join(folder, "progress.json")}
        for client, command in clients.items():
            for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
                walls, stalls, codes = [], [], []
                for run in range(runs):
                    out = Path(folder) / f"{path.stem}_{run}.ipynb"
                    started = time.perf_counter()
                    done = subprocess.run(command(path, out), capture_output=True, text=True, env=env,
                                          cwd=path.parent, timeout=1800)
                    walls.append(round(time.perf_counter() - started, 1))
                    codes.append(done.returncode)
                    stalls += _stalls(out) if out.exists() else ["no executed notebook was written"]
                rows.append({"client": client, "notebook": path.name, "wall_s": walls, "exit_codes": codes,
                             "stalls": stalls, "max_wall_s": max(walls)})
                print(f"{client} {path.name}: {walls} s, exit {codes}, stalls {len(stalls)}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grades", type=int, default=5, help="gradings per exercise (default 5)")
    parser.add_argument("--runs", type=int, default=3, help="runs per notebook and client (default 3)")
    args = parser.parse_args()
    for name in ("grades", "runs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    result = {"command": "benchmarks/speed.py " + " ".join(sys.argv[1:]), "machine": machine(),
              "cores": os.cpu_count(), "grading": grading_times(args.grades), "notebooks": notebook_times(args.runs)}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "speed_cpu.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {RESULTS / 'speed_cpu.json'}")


if __name__ == "__main__":
    main()
