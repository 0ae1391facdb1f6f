"""How long each lesson takes top to bottom under nbclient (the client behind ``jupyter execute``), on a quiet
machine or beside one busy process per core, and whether every check cell passed in every run.

    .venv/bin/python benchmarks/lesson_times.py                         # every lesson once, quiet
    .venv/bin/python benchmarks/lesson_times.py --busy --runs 5 --lessons 04,09,14,15

The bars (issue "measured well, and soon"): every lesson within 30 s quiet and within 75 s beside one busy
process per core; lessons 04, 09, 14 and 15 pass every check cell in 5 of 5 busy runs. A check cell is an
``assert``: a run whose cells all ran without an error passed them all. For each run the file keeps the
wall time, the three slowest cells, and the sentences the lesson printed (``Markdown`` outputs), so that a
ranking stated in one run can be held against the next. Writes ``results/lesson_times_cpu[_busy].json``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import RESULTS, machine  # noqa: E402

QUIET_BAR_S, BUSY_BAR_S = 30.0, 75.0


def _cell_seconds(cell) -> float | None:
    stamps = cell.get("metadata", {}).get("execution", {})
    start, end = stamps.get("iopub.execute_input"), stamps.get("shell.execute_reply")
    if not (start and end):
        return None
    return datetime.fromisoformat(end).timestamp() - datetime.fromisoformat(start).timestamp()


def _sentences(notebook) -> list[str]:
    """What the lesson said in prose from its run: every Markdown output, in order."""
    said = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            text = output.get("data", {}).get("text/markdown")
            if text:
                said.append("".join(text) if isinstance(text, list) else text)
    return said


def run_once(path: Path, keep: Path | None = None) -> dict:
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=600, kernel_name="python3", record_timing=True,
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    error = None
    started = time.perf_counter()
    try:
        client.execute()
    except CellExecutionError as exc:
        error = str(exc).strip().splitlines()[-1][:400]
    wall = time.perf_counter() - started
    if keep is not None:  # the executed notebook, to read its outputs and look at its figures
        keep.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, keep / path.name)
    cells = [(index, _cell_seconds(cell)) for index, cell in enumerate(notebook.cells) if cell.cell_type == "code"]
    slowest = sorted((c for c in cells if c[1] is not None), key=lambda c: -c[1])[:3]
    return {"wall_s": round(wall, 1), "passed": error is None, "error": error,
            "slowest_cells": [{"cell": i, "seconds": round(s, 1)} for i, s in slowest],
            "sentences": _sentences(notebook)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1, help="runs of each lesson (default 1)")
    parser.add_argument("--busy", action="store_true", help="one process busy-looping on every core throughout")
    parser.add_argument("--keep", type=Path, default=None, help="a folder to keep each lesson's last executed copy in")
    parser.add_argument("--lessons", default="", help="comma-separated lesson numbers, e.g. 04,09 (default: all)")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    wanted = [n.strip().zfill(2) for n in args.lessons.split(",") if n.strip()]
    unknown = [n for n in wanted if not any(p.name.startswith(n + "_") for p in paths)]
    if unknown:
        parser.error(f"--lessons {args.lessons!r}: no lesson numbered {', '.join(unknown)}; "
                     f"the lessons are {', '.join(p.name[:2] for p in paths)}")
    if wanted:
        paths = [p for p in paths if p.name[:2] in wanted]
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)] \
        if args.busy else []
    rows = []
    try:
        with tempfile.TemporaryDirectory() as folder:
            os.environ["DPTEACH_PROGRESS"] = os.path.join(folder, "progress.json")  # never the learner's file
            for path in paths:
                runs = []
                for _ in range(args.runs):
                    runs.append(run_once(path, args.keep))
                    print(f"{path.name}: {runs[-1]['wall_s']} s, {'passed' if runs[-1]['passed'] else 'FAILED'}"
                          f"{'' if runs[-1]['passed'] else ': ' + runs[-1]['error']}", flush=True)
                walls = [r["wall_s"] for r in runs]
                rows.append({"notebook": path.name, "wall_s": walls, "median_wall_s": statistics.median(walls),
                             "max_wall_s": max(walls), "passed": sum(r["passed"] for r in runs), "runs": runs})
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    bar = BUSY_BAR_S if args.busy else QUIET_BAR_S
    result = {"command": "benchmarks/lesson_times.py " + " ".join(sys.argv[1:]), "machine": machine(),
              "cores": os.cpu_count(), "busy_processes": len(hogs), "bar_s": bar,
              "within_bar": [r["notebook"] for r in rows if r["max_wall_s"] <= bar],
              "over_bar": [r["notebook"] for r in rows if r["max_wall_s"] > bar], "lessons": rows}
    RESULTS.mkdir(exist_ok=True)
    name = "lesson_times_cpu_busy.json" if args.busy else "lesson_times_cpu.json"
    if wanted:
        name = name.replace(".json", "_" + "_".join(wanted) + ".json")
    (RESULTS / name).write_text(json.dumps(result, indent=1) + "\n")
    print(f"over the {bar:.0f} s bar: {result['over_bar'] or 'none'}; wrote {RESULTS / name}")


if __name__ == "__main__":
    main()
