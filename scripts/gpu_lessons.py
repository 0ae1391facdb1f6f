"""Run every lesson top to bottom, as a learner's Run All would, and report what each did and showed.

    python scripts/gpu_lessons.py [--out benchmarks/results] [--budget 540] [--lessons 04,12]

Each notebook in ``notebooks/`` runs in a fresh Jupyter kernel (nbclient, what ``jupyter execute`` uses).
Every panel run writes the numbers behind its figures to a folder (``dpteach/widgets/record.py``), and
the report keeps, per lesson: how long it took, whether every cell ran, the check cells whose assertions
held (or the first error), and for every panel the model that trained (with its parameter count and why
it was chosen), whether the peers were emulated, and the numbers its figures drew.

Written for a GPU machine (``scripts/gpu_lessons.sh`` installs Jupyter's pieces there from carried
wheels), it runs anywhere: on a CPU it is what ``make test`` checks in the lessons, with a report.
The lessons run one after another inside ``--budget`` seconds; a lesson that would start with less
than ``MIN_LESSON_S`` left is reported as not run. Exit status 0 when every lesson ran and passed.

Files written: ``gpu_lessons_<machine>.json`` and ``gpu_lessons_<machine>.md`` in ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MIN_LESSON_S = 25  # a lesson needs about this much to start its kernel and its first world
IDENTITY = ("strategy", "label", "precision", "grad_comm", "accum_steps", "world_size", "link", "key", "stage")
NUMBERS = ("step_time_s", "exposed_comm_s", "overhead_s", "bytes_per_step", "samples_per_s", "efficiency",
           "relative_drift", "step_vs_fp32", "max_abs_diff_vs_single", "state_bytes", "peak_bytes",
           "allocator_peak_bytes", "messages_per_step")


def machine_name() -> str:
    import torch
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return "CPU"


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") or "unknown"


def checks_of(nb) -> tuple[list[dict], dict | None]:
    """The code cells with assertions that ran to the end, and the first error (cell, name, message)."""
    held, error = [], None
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        failed = next((o for o in cell.get("outputs", []) if o.get("output_type") == "error"), None)
        if failed is not None and error is None:
            error = {"cell": index, "name": failed.get("ename"), "message": str(failed.get("evalue"))[:2000]}
        asserts = len(re.findall(r"^\s*assert\b", cell.source, flags=re.M))
        if asserts and failed is None and cell.get("execution_count") is not None:
            held.append({"cell": index, "asserts": asserts})
    return held, error


def panel_summary(record: dict) -> dict:
    """A record's headline: the model, the peers, and a compact table of its rows' numbers."""
    result = record.get("result") or {}
    choice = result.get("model_choice") or {}
    rows = result.get("rows") or result.get("strategies") or []
    table = []
    for row in rows[:12] if isinstance(rows, list) else []:
        if isinstance(row, dict):
            table.append({k: row[k] for k in (*IDENTITY, *NUMBERS) if k in row and row[k] is not None
                          and not isinstance(row[k], (dict, list))})
    return {"title": record["title"], "seconds": record["seconds"], "error": record["error"],
            "model": result.get("model"), "params": choice.get("params"), "batch_per_rank": choice.get("batch_per_rank"),
            "model_reason": choice.get("reason"), "peers_note": result.get("peers_note"),
            "world_size": result.get("world_size"), "backend": result.get("backend"), "device": result.get("device"),
            "link": (result.get("link") or {}).get("name") if isinstance(result.get("link"), dict) else None,
            "sixteen_bit": (result.get("sixteen_bit") or {}).get("format"), "rows": table}


def run_lesson(path: Path, seconds_left: float, records: Path) -> dict:
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.read(path, as_version=4)
    os.environ["DPTEACH_RECORD_DIR"] = str(records)
    client = NotebookClient(nb, timeout=max(30, int(seconds_left)), kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    failure = None
    try:
        client.execute()
    except Exception as exc:  # a cell raised (its output holds the error) or the kernel timed out / died
        failure = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"[:2000]
    seconds = time.perf_counter() - start
    held, error = checks_of(nb)
    panels = [panel_summary(json.loads(p.read_text())) for p in sorted(records.glob("*.json"))]
    status = "passed" if failure is None and error is None else "failed"
    return {"notebook": path.name, "status": status, "seconds": seconds, "error": error,
            "failure": failure if status == "failed" else None, "checks_held": held,
            "asserts_held": sum(c["asserts"] for c in held), "panels": panels}


def issue_bars(lessons: list[dict]) -> dict:
    """The measured bars the GPU run is for, read from the lessons' own records."""
    bars = {}
    by_name = {lesson["notebook"]: lesson for lesson in lessons}
    drift = next((p for p in by_name.get("12_mixed_precision.ipynb", {}).get("panels", [])
                  if p["title"].startswith("Precision")), None)
    if drift and drift["rows"]:
        ratio = {r.get("precision"): r.get("step_vs_fp32") for r in drift["rows"]}
        chosen = drift.get("sixteen_bit") or "bf16"  # fp16 where bf16 is emulated (lesson 12; dpteach/ranks/gpus.py)
        bars[f"{chosen}_step_vs_fp32"] = {"model": drift["model"], "params": drift["params"], "value": ratio.get(chosen),
                                          "bar": "at most 0.4 at about 110 M parameters"}
    overlap = next((p for p in by_name.get("04_overlap.ipynb", {}).get("panels", []) if p["rows"]), None)
    if overlap:
        exposed = {r.get("strategy"): r.get("exposed_comm_s") for r in overlap["rows"]}
        if exposed.get("naive"):
            bars["overlap_hides_of_naive"] = {
                "value": 1 - exposed["overlap"] / exposed["naive"], "peers_note": overlap["peers_note"],
                "link": overlap["link"], "model": overlap["model"],
                "bar": "at least 0.6 with 1 GPU + 7 emulated peers over ib"}
    return bars


def markdown(report: dict) -> str:
    lines = [f"# Every lesson on {report['machine']}", "",
             f"`scripts/gpu_lessons.py`: torch {report['torch']}; {report['seconds']:.0f} s in all (budget "
             f"{report['budget_s']:.0f} s). Verdict: **{'all passed' if report['ok'] else 'NOT all passed'}**.", "",
             "| lesson | status | seconds | asserts held | models trained |", "|---|---|---|---|---|"]
    for lesson in report["lessons"]:
        models = sorted({f"{p['model']} ({p['params'] / 1e6:.1f} M)" for p in lesson.get("panels", [])
                         if p.get("model") and p.get("params")})
        lines.append(f"| {lesson['notebook']} | {lesson['status']} | {lesson.get('seconds', 0):.0f} | "
                     f"{lesson.get('asserts_held', 0)} | {', '.join(models) or '-'} |")
    lines += ["", "## The bars", ""]
    for name, bar in report["bars"].items():
        value = bar["value"]
        lines.append(f"- `{name}`: {'-' if value is None else f'{value:.2f}'} ({bar['bar']}; "
                     + ", ".join(f"{k} {v}" for k, v in bar.items() if k not in ("value", "bar") and v) + ")")
    for lesson in report["lessons"]:
        lines += ["", f"## {lesson['notebook']}: {lesson['status']}", ""]
        if lesson.get("error"):
            e = lesson["error"]
            lines.append(f"First error, cell {e['cell']}: `{e['name']}: {e['message'][:500]}`")
        elif lesson.get("failure"):
            lines.append(f"Failure: `{lesson['failure']}`")
        for panel in lesson.get("panels", []):
            lines.append(f"- **{panel['title']}** ({panel['seconds']:.1f} s)"
                         + (f": model {panel['model']}, {panel['params'] / 1e6:.1f} M parameters - {panel['model_reason']}"
                            if panel.get("params") else "")
                         + (f"; {panel['peers_note']}" if panel.get("peers_note") else "")
                         + (f"; ERROR {panel['error']}" if panel.get("error") else ""))
            for row in panel["rows"]:
                lines.append("  - " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                                for k, v in row.items()))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    parser.add_argument("--budget", type=float, default=540.0, help="seconds for all lessons together")
    parser.add_argument("--lessons", default="", help="comma-separated lesson numbers (default: all)")
    parser.add_argument("--first", default="", help="lesson numbers to run before the others (the report keeps "
                                                    "the course's order), e.g. the ones a measured bar is read from")
    args = parser.parse_args(argv)
    import torch
    wanted = {n.strip().zfill(2) for n in args.lessons.split(",") if n.strip()}
    first = [n.strip().zfill(2) for n in args.first.split(",") if n.strip()]
    notebooks = [p for p in sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")) if not wanted or p.name[:2] in wanted]
    notebooks.sort(key=lambda p: (first.index(p.name[:2]) if p.name[:2] in first else len(first), p.name))
    start, lessons = time.perf_counter(), []
    scratch = Path(tempfile.mkdtemp(prefix="dpteach-lessons-"))
    try:
        for path in notebooks:
            left = args.budget - (time.perf_counter() - start)
            if left < MIN_LESSON_S:
                lessons.append({"notebook": path.name, "status": "not run", "seconds": 0.0,
                                "failure": f"out of time: {left:.0f} s of the {args.budget:.0f} s budget left"})
                continue
            print(f"{path.name}: running ({left:.0f} s left)", flush=True)
            lesson = run_lesson(path, left, scratch / path.stem)
            print(f"{path.name}: {lesson['status']} in {lesson['seconds']:.0f} s, {lesson['asserts_held']} asserts held"
                  + (f" - {lesson['error']}" if lesson["error"] else ""), flush=True)
            lessons.append(lesson)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    seconds = time.perf_counter() - start
    lessons.sort(key=lambda lesson: lesson["notebook"])
    report = {"machine": machine_name(), "torch": torch.__version__, "seconds": seconds, "budget_s": args.budget,
              "ok": all(lesson["status"] == "passed" for lesson in lessons) and seconds <= args.budget,
              "lessons": lessons, "bars": issue_bars(lessons)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"gpu_lessons_{slug(report['machine'])}"
    (out / f"{name}.json").write_text(json.dumps(report, indent=1))
    (out / f"{name}.md").write_text(markdown(report))
    print(markdown(report).split("\n## ")[0])
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
