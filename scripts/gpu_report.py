"""Write the report of ``scripts/gpu_check.sh``: one JSON file and one markdown file, named after the GPU.

    python scripts/gpu_report.py --doctor doctor.json --junit pytest.xml --seconds 312 --out benchmarks/results

``doctor.json`` is what ``dpteach doctor --gpu --json`` printed (empty or missing: the check did not
finish) and ``pytest.xml`` the JUnit file of the GPU tests. The files written are
``gpu_check_<gpu>.json`` and ``gpu_check_<gpu>.md``, e.g. ``gpu_check_nvidia_h200.md``; the markdown
says what passed, what failed, what could not be covered, and labels the shared-GPU worlds' timings
as meaningless. Exit status 0 when the check and the tests all passed.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import xml.etree.ElementTree as ET


def read_doctor(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_junit(path: str) -> dict:
    """Counts and the names of failed tests from a JUnit XML file ({} when there is none)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return {}
    cases = root.iter("testcase")
    out = {"passed": 0, "failed": [], "skipped": []}
    for case in cases:
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None or case.find("error") is not None:
            out["failed"].append(name)
        elif case.find("skipped") is not None:
            out["skipped"].append(name)
        else:
            out["passed"] += 1
    return out


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") or "unknown"


def build(doctor: dict | None, tests: dict, seconds: float) -> dict:
    device = (doctor or {}).get("gpu") or ("CPU" if (doctor or {}).get("device") == "cpu" else "unknown GPU")
    ok = bool(doctor and doctor.get("ok")) and bool(tests) and not tests.get("failed")
    return {"machine": device, "gpus": (doctor or {}).get("gpus"), "torch": (doctor or {}).get("torch"),
            "cuda": (doctor or {}).get("cuda"), "nccl": (doctor or {}).get("nccl"), "ok": ok,
            "seconds": seconds, "doctor": doctor, "tests": tests}


def markdown(report: dict) -> str:
    doctor, tests = report["doctor"], report["tests"]
    lines = [f"# GPU check on {report['machine']}", "",
             f"`scripts/gpu_check.sh`: {report['gpus']} GPU(s), torch {report['torch']}, CUDA {report['cuda']}, "
             f"NCCL {report['nccl']}; {report['seconds']:.0f} s in all. Verdict: "
             f"**{'all passed' if report['ok'] else 'NOT all passed'}**.", ""]
    if doctor is None:
        lines += ["`dpteach doctor --gpu` did not finish: see `doctor_gpu.stderr`.", ""]
    else:
        lines += [f"## `dpteach doctor --gpu`: {doctor['checks']} checks, {len(doctor['failed'])} failed, "
                  f"{doctor['seconds']:.0f} s", ""]
        lines += [f"- FAILED: {name}" for name in doctor["failed"]]
        lines += [f"- not covered: {line}" for line in doctor.get("unavailable", [])]
        lines += ["", "| world | backend | ranks | checks run | timings |", "|---|---|---|---|---|"]
        for world in doctor["worlds"]:
            if world.get("unavailable"):
                lines.append(f"| {world['label']} | nccl | - | could not form | - |")
                continue
            timings = "meaningful" if world.get("timings_meaningful", True) else "correctness only: meaningless"
            lines.append(f"| {world['label']} | {world['backend']} | {world['world_size']} | {world.get('scope', 'full')}"
                         f" | {timings} |")
        lines += ["", "Step times (ms) and distance from single-process training, per world:", "",
                  "| world | table | strategy | step (ms) | max abs diff |", "|---|---|---|---|---|"]
        for world in doctor["worlds"]:
            for key in ("compare", "accumulation", "sharded"):
                for row in (world.get(key) or {}).get("rows", []):
                    lines.append(f"| {world['label']} | {key} | {row['strategy']} | {row['step_time_s'] * 1e3:.2f} | "
                                 f"{row['max_abs_diff_vs_single']:.1e} |")
        lines += ["", "Lesson 12's precisions (step time relative to fp32; drift from the fp32 run) and one rank "
                  "standing for 8 on an emulated link (exposed communication against the link's time per step):", ""]
        for world in doctor["worlds"]:
            for row in (world.get("precision") or {}).get("rows", []):
                lines.append(f"- {world['label']}: {row['precision']} step {row['step_vs_fp32']:.2f}x fp32, drift "
                             f"{row['relative_drift']:.2%}, {row['skipped_steps']} steps skipped")
            peers = world.get("emulated_peers")
            for row in (peers or {}).get("rows", []):
                if row["link_report"]:
                    lines.append(f"- {world['label']}: 1 rank for {peers['world_size']}, {row['strategy']}: exposed "
                                 f"{row['exposed_comm_s'] * 1e3:.1f} ms of a {row['link_report']['link_seconds_per_step'] * 1e3:.1f} "
                                 f"ms link time per step, set by the {row['link_report']['time_set_by']}, emulation "
                                 f"error {row['link_report'].get('emulation_error') or 0:.1%}")
    lines += ["", "## GPU tests (`pytest -m 'gpu or multigpu'`)", ""]
    if not tests:
        lines.append("The tests did not report (see `pytest_gpu.txt`).")
    else:
        lines.append(f"{tests['passed']} passed, {len(tests['failed'])} failed, {len(tests['skipped'])} skipped.")
        lines += [f"- FAILED: `{name}`" for name in tests["failed"]]
        lines += [f"- skipped: `{name}`" for name in tests["skipped"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--doctor", required=True)
    parser.add_argument("--junit", required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    report = build(read_doctor(args.doctor), read_junit(args.junit), args.seconds)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"gpu_check_{slug(report['machine'])}")
    for path, text in ((f"{stem}.json", json.dumps(report, indent=1, default=str)), (f"{stem}.md", markdown(report))):
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    print(f"report: {stem}.json and {stem}.md")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
