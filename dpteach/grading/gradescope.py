"""The grade as Gradescope reads it: ``results.json``, and the autograder bundle that writes it.

Gradescope runs an autograder as a zip with two files at its root (its "Autograder Specifications",
gradescope-autograders.readthedocs.io/en/latest/specs/): ``setup.sh``, run once as root when the
image is built, and ``run_autograder``, run for every submission with the working directory
``/autograder``; the learner's files are in ``/autograder/submission``, the zip's in
``/autograder/source``, and the grade must be written to ``/autograder/results/results.json``.

``results.json`` uses only the fields that page documents: at the top ``score``, ``execution_time``,
``output``, ``visibility``, ``stdout_visibility`` and ``extra_data``; per test ``name``, ``number``,
``score``, ``max_score``, ``status`` (passed or failed), ``output`` and ``visibility`` (``visible``,
``hidden``, ``after_due_date`` or ``after_published``). Each of the course's checks is one test. A
hidden check - its cases are the grader's secret - is shown ``after_published``, and its output is the
grader's own vague message, never a case. The course's grader stays the judge: the score is its score,
zero for a forbidden call or tampering, whatever the single checks say.
"""
from __future__ import annotations

import shutil
import stat
from pathlib import Path

from .report import Report

HIDDEN_VISIBILITY = "after_published"


def results_json(report: Report) -> dict:
    """Gradescope's ``results.json`` for one graded notebook."""
    tests = []
    for number, check in enumerate(report.checks, 1):
        lines = [check.message] if check.message else []
        if check.outcome in ("failed", "error", "timed_out") and check.hint:
            lines.append(f"hint: {check.hint}")
        full = check.earned == check.points
        tests.append({"name": check.name, "number": str(number),  # a hidden check's name says so (spec.Check)
                      "score": check.earned, "max_score": check.points,
                      "status": "passed" if full else "failed",
                      "output": "\n".join(lines) or ("passed" if full else check.outcome),
                      "visibility": HIDDEN_VISIBILITY if check.hidden else "visible"})
    return {"score": report.score, "execution_time": round(report.elapsed_s, 1), "output": report.text(),
            "visibility": "visible", "stdout_visibility": "hidden",
            "extra_data": {"exercise": report.exercise, "status": report.status, "max_score": report.max_score},
            "tests": tests}


def failure_results(message: str) -> dict:
    """``results.json`` when there is nothing to grade (no notebook submitted, an unreadable one)."""
    return {"score": 0, "output": message, "visibility": "visible", "stdout_visibility": "hidden",
            "extra_data": {"status": "error"}, "tests": []}


SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image: it installs Python's
# packages for the course, CPU-only (Gradescope's machines have no GPU, and torch's CPU wheels are a
# fraction of the CUDA ones' size). DPTEACH_PYTHON and TORCH_INDEX let it be tried outside Gradescope.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
cd "$HERE"
PY="${{DPTEACH_PYTHON:-python3}}"
# Ubuntu 24.04's Python refuses pip installs outside a virtual environment (PEP 668); this image is ours
export PIP_BREAK_SYSTEM_PACKAGES=1
if ! "$PY" -m pip --version >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-pip python3-venv
fi
TORCH_INDEX="${{TORCH_INDEX-https://download.pytorch.org/whl/cpu}}"
if [ -n "$TORCH_INDEX" ]; then
  "$PY" -m pip install --quiet --extra-index-url "$TORCH_INDEX" "{torch}"
else
  "$PY" -m pip install --quiet "{torch}"
fi
[ -z "{wheel}" ] || [ -e "$HERE/{wheel}" ] || cd "${{AUTOGRADER_ROOT:-/autograder}}/source"  # the zip's files
"$PY" -m pip install --quiet {install}
"$PY" -m dpteach grade --help >/dev/null
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for every submission: grade exercise {exercise} from /autograder/submission on
# real ranks and write /autograder/results/results.json. AUTOGRADER_ROOT and DPTEACH_PYTHON let it be
# tried in a folder shaped like /autograder.
set -uo pipefail
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
PY="${{DPTEACH_PYTHON:-python3}}"
mkdir -p "$ROOT/results"
cd "$ROOT"
export DPTEACH_PROGRESS="$ROOT/results/.progress.json"   # attempts are not the learner's own progress
"$PY" -m dpteach grade --submission "$ROOT/submission" --exercise {exercise} \\
    --format gradescope --output "$ROOT/results/results.json" --no-record
status=$?
# exit 0 whatever the grade: a failed check is a grade, not an autograder failure (1 is not full marks)
[ "$status" -le 1 ] || exit "$status"
"""


def write_bundle(exercise: str, folder: Path, *, wheel: Path | None = None, torch: str = "torch") -> dict:
    """Write an autograder for ``exercise`` into ``folder``: ``setup.sh``, ``run_autograder``, the wheel
    when one is given (else setup.sh installs ``dpteach`` from the package index), and ``autograder.zip``
    with all of them at its root, as Gradescope wants. Returns the paths written."""
    from . import get_exercise

    chosen = get_exercise(exercise)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    install = '"dpteach"'
    if wheel is not None:
        wheel = Path(wheel)
        if not (wheel.is_file() and wheel.suffix == ".whl"):
            raise ValueError(f"wheel={str(wheel)!r} is not a wheel file: build one with `python -m build` "
                             f"(dist/dpteach-*.whl) or leave it out to install dpteach from the index")
        shutil.copy2(wheel, folder / wheel.name)
        files[wheel.name] = folder / wheel.name
        install = f'"./{wheel.name}"'
    for name, text in (("setup.sh", SETUP_SH.format(torch=torch, install=install, wheel=wheel.name if wheel else "")),
                       ("run_autograder", RUN_AUTOGRADER.format(exercise=chosen.id))):
        path = folder / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        files[name] = path
    import zipfile
    archive = folder / "autograder.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, path in files.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (path.stat().st_mode & 0xFFFF) << 16  # keep the scripts executable
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, path.read_bytes())
    return {"exercise": chosen.id, "folder": str(folder), "zip": str(archive), "files": sorted(files)}


def find_submission(folder: Path, exercise) -> Path:
    """The notebook to grade in a submission folder: the one named like the exercise's notebook, else the
    only notebook there (Gradescope keeps the learner's file names)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"submission={str(folder)!r} is not a folder")
    notebooks = sorted(p for p in folder.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    named = [p for p in notebooks if p.name == exercise.notebook_name]
    if named:
        return named[0]
    if len(notebooks) == 1:
        return notebooks[0]
    raise ValueError(f"submission={str(folder)!r} holds {len(notebooks)} notebooks and none is named "
                     f"{exercise.notebook_name}: submit that notebook")
