"""Per test file: what it checks (the first sentence of its docstring) and how long it took, from pytest's JUnit
report; with a second report, before and after side by side.

    .venv/bin/python -m pytest tests exercises --nbval-lax --junitxml=after.xml
    .venv/bin/python scripts/test_times.py after.xml                 # one run
    .venv/bin/python scripts/test_times.py before.xml after.xml      # two, compared
    .venv/bin/python scripts/test_times.py pytest-output.txt         # pytest's printed --durations=0 instead

A test's time in the report is its setup, call and teardown together (pytest's default, ``junit_duration_report
= total``), so a module's shared fixture counts in the file that starts it.
"""
from __future__ import annotations

import ast
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def seconds_by_file(report: str) -> dict[str, float]:
    """From a JUnit XML report, or from pytest's printed output with ``--durations=0`` (setup, call, teardown)."""
    found: dict[str, float] = defaultdict(float)
    if not report.endswith(".xml"):
        for line in Path(report).read_text(errors="replace").splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0].endswith("s") and parts[1] in ("setup", "call", "teardown"):
                path = parts[2].split("::")[0]
                found["exercises/*.ipynb (nbval)" if path.startswith("exercises/") else path] += float(parts[0][:-1])
        return dict(found)
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("classname", "")
        path = case.get("file") or ("/".join(name.split(".")[:2]) + ".py" if name.startswith("tests.") else name)
        if name.startswith("exercises."):
            path = "exercises/*.ipynb (nbval)"
        found[path] += float(case.get("time") or 0)
    return dict(found)


def what_it_checks(path: str) -> str:
    file = ROOT / path
    if not file.is_file() or file.suffix != ".py":
        return "every exercise notebook as it ships runs without an error (`--nbval-lax`)"
    doc = ast.get_docstring(ast.parse(file.read_text())) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    return first.split(". ")[0].rstrip(".") if first else ""


def main(reports: list[str]) -> int:
    if not 1 <= len(reports) <= 2:
        print(__doc__)
        return 2
    runs = [seconds_by_file(r) for r in reports]
    files = sorted(set().union(*runs), key=lambda f: -runs[-1].get(f, 0))
    head = "| file | what it checks | " + " | ".join(["before (s)", "after (s)"][-len(runs):] if len(runs) == 2
                                                   else ["time (s)"]) + " |"
    print(head)
    print("|---|---|" + "---:|" * len(runs))
    for f in files:
        times = " | ".join(f"{run[f]:.0f}" if f in run else "-" for run in runs)
        print(f"| `{f}` | {what_it_checks(f)} | {times} |")
    print("| **all** | | " + " | ".join(f"**{sum(run.values()) / 60:.1f} min**" for run in runs) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
