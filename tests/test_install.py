"""The course as a newcomer installs it: a wheel, a fresh virtual environment, no clone in sight.

One module-scoped install serves every test here, made the way an instructor's Gradescope image is:
``python -m build`` makes the wheel, ``dpteach autograder`` writes the bundle around it, and the bundle's
own ``setup.sh`` installs torch (CPU) and the wheel into a fresh virtual environment outside the
repository. Then, from that environment only (its ``dpteach``, working directories outside the clone):

* ``dpteach lab`` copies the course into a workspace and its server lists the workspace's notebooks;
* an exercise is graded from the workspace, with the reference solution written into it;
* a second ``dpteach lab`` leaves a notebook the learner edited byte for byte as it was;
* Gradescope's ``run_autograder``, in a folder shaped like ``/autograder``, gives the reference solution
  full marks in a ``results.json`` holding only Gradescope's documented fields, and a wrong one less.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from answers.solutions import solution
from answers.wrong_variants import VARIANTS
from dpteach.grading import get_exercise

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]
EXERCISE = get_exercise("03")  # the quickest to grade (about 3 s on 2 cores)

# Gradescope's results.json, as its "Autograder Specifications" page documents it: these keys and no others.
TOP_KEYS = {"score", "execution_time", "output", "output_format", "test_output_format", "test_name_format",
            "visibility", "stdout_visibility", "extra_data", "tests", "leaderboard"}
TEST_KEYS = {"score", "max_score", "status", "name", "name_format", "number", "output", "output_format",
             "tags", "visibility", "extra_data"}
VISIBILITIES = {"hidden", "after_due_date", "after_published", "visible"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A wheel, its Gradescope bundle, and a fresh environment the bundle's setup.sh installed it into."""
    base = tmp_path_factory.mktemp("installed")
    # the sdist first and the wheel from it, as `python -m build` does: what MANIFEST.in leaves out of the
    # sdist is missing from the wheel too, and no stale build/ folder of the clone leaks into it
    built = subprocess.run([sys.executable, "-m", "build", "--outdir", str(base / "dist"), str(ROOT)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    # and says nothing against the project's own metadata (pyproject.toml, MANIFEST.in)
    said = [line for line in (built.stdout + built.stderr).splitlines()
            if re.search(r"deprecat|no previously-included|SetuptoolsWarning|project\.license", line, re.I)]
    assert not said, "\n".join(said)
    wheel = next((base / "dist").glob("dpteach-*.whl"))
    bundle = base / "bundle"
    written = subprocess.run([sys.executable, "-m", "dpteach", "autograder", EXERCISE.id, "--out", str(bundle),
                              "--wheel", str(wheel), "--torch", f"torch=={torch.__version__.split('+')[0]}"],
                             capture_output=True, text=True, timeout=120)
    assert written.returncode == 0, written.stderr
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    env = {**os.environ, "DPTEACH_PYTHON": str(python), "TORCH_INDEX": "", "HOME": str(base / "home"),
           "PIP_CACHE_DIR": os.environ.get("PIP_CACHE_DIR") or str(Path.home() / ".cache" / "pip")}  # a fresh
    # home (no progress file, no workspace of ours), pip's download cache kept as on any machine
    for name in ("DPTEACH_COURSE", "DPTEACH_QUIZZES", "DPTEACH_WORKSPACE", "PYTHONPATH", "VIRTUAL_ENV"):
        env.pop(name, None)
    (base / "home").mkdir()
    setup = subprocess.run(["bash", str(bundle / "setup.sh")], capture_output=True, text=True, env=env,
                           cwd=base, timeout=900)
    assert setup.returncode == 0, setup.stdout[-3000:] + setup.stderr[-3000:]
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    env["DPTEACH_PROGRESS"] = str(base / "home" / "progress.json")
    return {"base": base, "wheel": wheel, "bundle": bundle, "python": python, "dpteach": venv / "bin" / "dpteach",
            "env": env}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_lab_and_list(installed, workspace: Path) -> dict:
    """Start ``dpteach lab`` on ``workspace`` from the fresh environment, ask its server for the workspace's
    notebooks, stop it; returns {folder: [notebook names]} and what the command printed."""
    port, token = _free_port(), secrets.token_hex(12)
    log = open(installed["base"] / f"lab-{port}.log", "w+")
    lab = subprocess.Popen([str(installed["dpteach"]), "lab", "--no-browser", "--port", str(port),
                            "--workspace", str(workspace), "--", f"--IdentityProvider.token={token}"],
                           stdout=log, stderr=subprocess.STDOUT, env=installed["env"], cwd=installed["base"],
                           start_new_session=True)
    try:
        listed, deadline = {}, time.monotonic() + 120
        while time.monotonic() < deadline and lab.poll() is None:
            try:
                for folder in ("notebooks", "exercises"):
                    url = f"http://127.0.0.1:{port}/api/contents/{folder}?token={token}"
                    with urllib.request.urlopen(url, timeout=5) as reply:
                        listed[folder] = sorted(e["name"] for e in json.load(reply)["content"]
                                                if e["type"] == "notebook")
                break
            except OSError:
                time.sleep(0.5)
        log.seek(0)
        printed = log.read()
        assert listed, f"the lab never answered (exit {lab.poll()}):\n{printed[-3000:]}"
        return {"listed": listed, "printed": printed}
    finally:
        if lab.poll() is None:
            os.killpg(lab.pid, signal.SIGTERM)
            try:
                lab.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(lab.pid, signal.SIGKILL)
        log.close()


def with_solution(notebook: Path, code: str) -> None:
    data = json.loads(notebook.read_text())
    for cell in data["cells"]:
        if "solution" in cell["metadata"].get("tags", []):
            cell["source"] = code
    notebook.write_text(json.dumps(data, indent=1))


def test_the_wheel_carries_the_course_and_nothing_of_the_clone_is_used(installed):
    import zipfile
    names = zipfile.ZipFile(installed["wheel"]).namelist()
    for folder, count in (("notebooks", len(list((ROOT / "notebooks").glob("*.ipynb")))),
                          ("exercises", len(list((ROOT / "exercises").glob("*.ipynb")))),
                          ("quizzes", len(list((ROOT / "quizzes").glob("*.yaml"))))):
        suffix = ".yaml" if folder == "quizzes" else ".ipynb"
        assert len([n for n in names if n.startswith(f"dpteach/_course/{folder}/") and n.endswith(suffix)]) == count
    where = subprocess.run([str(installed["python"]), "-c", "import dpteach, dpteach.materials as m; "
                            "print(dpteach.__file__); print(m.course_root()); print(m.installed())"],
                           capture_output=True, text=True, env=installed["env"], cwd=installed["base"])
    package, course, is_installed = where.stdout.split()
    assert not package.startswith(str(ROOT)) and is_installed == "True", where.stdout + where.stderr
    quiz = subprocess.run([str(installed["dpteach"]), "quiz", "--list"], capture_output=True, text=True,
                          env=installed["env"], cwd=installed["base"])
    assert quiz.returncode == 0 and "sending_less" in quiz.stdout, quiz.stdout[-2000:] + quiz.stderr[-2000:]


def test_lab_makes_a_workspace_grades_from_it_and_keeps_edits(installed):
    workspace = installed["base"] / "my course"
    first = start_lab_and_list(installed, workspace)
    assert first["listed"]["notebooks"] == sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert first["listed"]["exercises"] == sorted(p.name for p in (ROOT / "exercises").glob("*.ipynb"))
    assert "copied" in first["printed"]

    # an exercise, graded from the workspace with the workspace's dpteach
    mine = workspace / "exercises" / EXERCISE.notebook_name
    with_solution(mine, solution(EXERCISE.id))
    graded = subprocess.run([str(installed["dpteach"]), "grade", EXERCISE.id, "--json", "--no-record"],
                            capture_output=True, text=True, env=installed["env"], cwd=workspace, timeout=300)
    report = json.loads(graded.stdout)
    assert graded.returncode == 0 and report["score"] == report["max_score"] > 0, graded.stdout[-3000:]

    # a lesson the learner edited, and the exercise they solved, survive a second lab byte for byte
    lesson = workspace / "notebooks" / "03_bucketing.ipynb"
    edited = json.loads(lesson.read_text())
    edited["cells"].insert(1, {"cell_type": "markdown", "id": "my-note", "metadata": {}, "source": "My own note."})
    lesson.write_text(json.dumps(edited, indent=1))
    before = {p: p.read_bytes() for p in (lesson, mine)}
    (workspace / "notebooks" / "05_accumulation.ipynb").unlink()  # a deleted lesson comes back
    second = start_lab_and_list(installed, workspace)
    assert "05_accumulation.ipynb" in second["listed"]["notebooks"]
    assert all(p.read_bytes() == content for p, content in before.items())
    states = subprocess.run([str(installed["dpteach"]), "workspace", "--workspace", str(workspace)],
                            capture_output=True, text=True, env=installed["env"], cwd=installed["base"])
    rows = dict(line.split(None, 1) for line in states.stdout.splitlines()[1:] if line.strip())
    assert rows["notebooks/03_bucketing.ipynb"].strip() == "edited"
    assert rows[f"exercises/{EXERCISE.notebook_name}"].strip() == "edited"
    assert rows["notebooks/05_accumulation.ipynb"].strip() == "as shipped"


def gradescope(installed, tmp_path, code: str) -> dict:
    """Run the bundle's run_autograder in a folder shaped like /autograder, the submission holding the
    exercise notebook with ``code`` in its solution cell; returns results.json."""
    root = tmp_path / "autograder"
    shutil.copytree(installed["bundle"], root / "source")
    (root / "submission").mkdir()
    submitted = root / "submission" / EXERCISE.notebook_name
    shutil.copy(ROOT / "exercises" / EXERCISE.notebook_name, submitted)
    with_solution(submitted, code)
    done = subprocess.run(["bash", str(root / "source" / "run_autograder")], capture_output=True, text=True,
                          env={**installed["env"], "AUTOGRADER_ROOT": str(root)}, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    results = json.loads((root / "results" / "results.json").read_text())
    assert set(results) <= TOP_KEYS, set(results) - TOP_KEYS
    assert results["tests"] and all(set(t) <= TEST_KEYS for t in results["tests"])
    assert {t["visibility"] for t in results["tests"]} <= VISIBILITIES and results["visibility"] in VISIBILITIES
    assert all(isinstance(t["score"], (int, float)) and 0 <= t["score"] <= t["max_score"] for t in results["tests"])
    assert results["score"] <= sum(t["max_score"] for t in results["tests"])
    return results


def test_gradescope_run_autograder_full_marks_for_the_reference_and_less_for_a_wrong_one(installed, tmp_path):
    full = sum(check.points for check in EXERCISE.checks)
    right = gradescope(installed, tmp_path / "right", solution(EXERCISE.id))
    assert right["score"] == full == sum(t["max_score"] for t in right["tests"])
    assert all(t["status"] == "passed" for t in right["tests"])
    hidden = [t for t in right["tests"] if t["name"].startswith("hidden: ")]
    assert hidden and all(t["visibility"] == "after_published" for t in hidden)

    variant = next(v for v in VARIANTS if v.exercise == EXERCISE.id)
    wrong = gradescope(installed, tmp_path / "wrong", variant.source())
    assert wrong["score"] < full
    assert any(t["status"] == "failed" and t["score"] < t["max_score"] for t in wrong["tests"])

    empty = tmp_path / "nothing" / "autograder"
    shutil.copytree(installed["bundle"], empty / "source")
    (empty / "submission").mkdir()
    done = subprocess.run(["bash", str(empty / "source" / "run_autograder")], capture_output=True, text=True,
                          env={**installed["env"], "AUTOGRADER_ROOT": str(empty)}, timeout=120)
    nothing = json.loads((empty / "results" / "results.json").read_text())
    assert done.returncode == 0 and nothing["score"] == 0 and "Nothing was graded" in nothing["output"]
