"""The exercise notebooks in an nbgrader course: their cell metadata, and nbgrader's own commands on them.

``exercises/build.py`` writes nbgrader's cell metadata (schema version 3) into every exercise notebook, and
under nbgrader ``check()`` returns its score as the check cell's value, which nbgrader takes as the cell's
partial credit (``dpteach/grading/__init__.py``). These tests hold that to nbgrader itself (0.9):

* the metadata passes nbgrader's own schema reader (``nbgrader.nbgraderformat``), and marks the stub as the
  solution cell and ``check()`` as the test cell worth the exercise's total;
* ``nbgrader validate --invert`` accepts every notebook as committed (the stub: no test cell passes);
* ``nbgrader validate`` accepts exercise 03 with its reference solution and refuses a known-wrong one;
* ``nbgrader generate_assignment`` (solutions clearing off, as the README says) releases the stub as it is,
  and ``nbgrader autograde`` puts this grader's score of a partly wrong submission into nbgrader's gradebook.

nbgrader runs in a subprocess, through its command line, on copies under ``tmp_path``. Its ``validate``
exits with 0 whatever it finds, so its verdict is read from what it prints. Exercise 03 is the cheap one to
solve (its functions compute on one rank's data; grading it takes about 2.5 s on 2 cores); the whole file
took 73 to 100 s on 2 cores shared with other work, two thirds of it ``validate --invert`` running ten notebooks.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from answers.solutions import solution
from answers.wrong_variants import VARIANTS
from dpteach.grading import all_exercises, check, get_exercise
from dpteach.progress import ProgressStore

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = all_exercises()
CHEAP = "03"
WRONG = next(v for v in VARIANTS if v.exercise == CHEAP and "forward order" in v.name)

# What nbgrader validate prints (nbgrader/validator.py, validate_and_print).
ALL_PASS = "Success! Your notebook passes all the tests."
NONE_PASS = "Success! The notebook does not pass any tests."


def nbgrader():
    return pytest.importorskip("nbgrader", reason="nbgrader is not installed (pip install -e '.[nbgrader]')")


def tagged(notebook, tag):
    return [cell for cell in notebook.cells if tag in cell.metadata.get("tags", [])]


def run_nbgrader(tmp_path, *args, timeout=300) -> str:
    """``python -m nbgrader ARGS`` in ``tmp_path``, its stdout and stderr in one stream, in order."""
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "jupyter-runtime"),
               # generate_assignment runs the database migrations with the ``alembic`` command
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    done = subprocess.run([sys.executable, "-u", "-m", "nbgrader", *args], cwd=tmp_path, env=env, timeout=timeout,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert done.returncode == 0, done.stdout
    return done.stdout


VERDICTS = ("Success!", "VALIDATION FAILED", "NOTEBOOK PASSED", "THE CONTENTS OF")  # nbgrader's validator.py


def verdicts(output: str) -> dict:
    """``nbgrader validate``'s verdict for each notebook, by file name: its "Success!" line, or a failure's
    verdict line and the cells it lists. Only the verdict is judged: other lines of the output - nbgrader's
    log, or what a kernel's process printed on its way out (libzmq once printed an assertion there while the
    kernel shut down after a notebook that had passed) - say nothing about the notebook."""
    found = {}
    for block in output.split("Validating '")[1:]:
        name = Path(block[:block.index("'")]).name
        lines = [line for line in block.splitlines()[1:] if not line.startswith("[")]  # not a log line
        start = next((i for i, line in enumerate(lines) if line.startswith(VERDICTS)), None)
        if start is None:
            found[name] = "\n".join(lines).strip()  # no verdict: shown whole, so the failure says what came
        elif lines[start].startswith("Success!"):
            found[name] = lines[start].strip()
        else:
            found[name] = "\n".join(line for line in lines[start:] if not line.startswith("Assertion failed:")).strip()
    return found


def test_a_line_a_kernel_prints_on_its_way_out_does_not_change_the_verdict():
    stray = "Assertion failed: pfd.revents & POLLIN (src/signaler.cpp:238)"
    output = (f"[ValidateApp | INFO] Validating\nValidating '/work/09_zero2.ipynb'\n{NONE_PASS}\n{stray}\n"
              f"Validating '/work/03_buckets.ipynb'\n{stray}\nVALIDATION FAILED ON 1 CELL(S)! ...\ncheck(\"03\")\n")
    assert verdicts(output) == {"09_zero2.ipynb": NONE_PASS,
                                "03_buckets.ipynb": 'VALIDATION FAILED ON 1 CELL(S)! ...\ncheck("03")'}


def notebook_with(tmp_path, exercise, code: str, name: str | None = None) -> Path:
    notebook = nbformat.read(ROOT / "exercises" / exercise.notebook_name, as_version=4)
    (cell,) = tagged(notebook, "solution")
    cell.source = code
    path = tmp_path / (name or exercise.notebook_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, path)
    return path


# -- the metadata ------------------------------------------------------------------------------------

@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.stem)
def test_metadata_passes_nbgraders_schema_and_marks_the_solution_and_the_test_cell(exercise):
    nbgrader()
    from nbgrader import utils
    from nbgrader.nbgraderformat import SCHEMA_VERSION, MetadataValidator, read

    path = ROOT / "exercises" / exercise.notebook_name
    with open(path, encoding="utf-8") as handle:
        notebook = read(handle, as_version=4)  # nbgrader's reader: raises on metadata it does not accept
    validator = MetadataValidator()
    validator.validate_nb(notebook)
    before = json.dumps(notebook, sort_keys=True)
    validator.upgrade_notebook_metadata(notebook)  # drops keys the schema does not know, upgrades old ones
    assert json.dumps(notebook, sort_keys=True) == before

    marked = [cell for cell in notebook.cells if "nbgrader" in cell.metadata]
    assert all(cell.metadata.nbgrader["schema_version"] == SCHEMA_VERSION == 3 for cell in marked)
    # checksums and cell types are generate_assignment's to compute, for the students' version
    assert not any({"checksum", "cell_type"} & set(cell.metadata.nbgrader) for cell in marked)

    (stub,) = tagged(notebook, "solution")
    assert stub.source == exercise.stub.rstrip()
    assert utils.is_solution(stub) and not utils.is_grade(stub) and not utils.is_locked(stub)
    assert stub.metadata.nbgrader["grade_id"] == f"ex{exercise.id}-solution"

    (test,) = tagged(notebook, "check")
    assert notebook.cells[-1] is test and utils.is_grade(test) and utils.is_locked(test) and not utils.is_solution(test)
    assert test.metadata.nbgrader["points"] == exercise.max_score
    assert test.metadata.nbgrader["grade_id"] == f"ex{exercise.id}-check"
    # the score check() returns under nbgrader is the cell's value only if the call is its last line
    assert test.source.splitlines()[-1] == f'check("{exercise.id}")'

    (tries,) = tagged(notebook, "try")
    assert "nbgrader" not in tries.metadata  # learners are told to change it: an ordinary cell
    texts = [cell for cell in notebook.cells if cell.cell_type == "markdown"]
    assert len(texts) == 3 and all(utils.is_locked(cell) and not utils.is_grade(cell) and not utils.is_solution(cell)
                                   for cell in texts)
    assert [cell.metadata.nbgrader["grade_id"] for cell in texts] == [
        f"ex{exercise.id}-intro", f"ex{exercise.id}-try-text", f"ex{exercise.id}-check-text"]
    assert sum(utils.is_grade(cell) for cell in notebook.cells) == 1


def test_nbgraders_default_release_would_replace_the_stub():
    """Why the README says to release with ``--ClearSolutions.enabled=False``: nbgrader's ClearSolutions
    replaces a solution cell without ``### BEGIN SOLUTION`` markers by its own two-line stub, and the
    grader tells "not attempted" from an attempt by the exercise's stub."""
    nbgrader()
    from nbgrader.preprocessors import ClearSolutions

    exercise = get_exercise(CHEAP)
    notebook = nbformat.read(ROOT / "exercises" / exercise.notebook_name, as_version=4)
    kept, _ = ClearSolutions(enabled=False)(notebook, {})
    assert tagged(kept, "solution")[0].source == exercise.stub.rstrip()
    cleared, _ = ClearSolutions()(notebook, {})
    assert tagged(cleared, "solution")[0].source == "# YOUR CODE HERE\nraise NotImplementedError()"


def test_check_returns_the_score_only_under_nbgrader(monkeypatch, capsys):
    exercise = get_exercise(CHEAP)
    namespace = {}
    exec(exercise.stub, namespace)
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    assert check(CHEAP, namespace) is None
    plain = capsys.readouterr().out
    monkeypatch.setenv("NBGRADER_EXECUTION", "validate")
    assert check(CHEAP, namespace) == 0
    assert capsys.readouterr().out == plain and "not attempted" in plain


# -- nbgrader's commands -----------------------------------------------------------------------------

@pytest.mark.slow
def test_validate_invert_accepts_every_released_notebook(tmp_path):
    nbgrader()
    for exercise in EXERCISES:
        (tmp_path / exercise.notebook_name).write_bytes((ROOT / "exercises" / exercise.notebook_name).read_bytes())
    output = run_nbgrader(tmp_path, "validate", "--invert", *[e.notebook_name for e in EXERCISES])
    found = verdicts(output)
    assert found == {e.notebook_name: NONE_PASS for e in EXERCISES}, output
    assert ProgressStore().load()["exercises"] == {}


@pytest.mark.slow
def test_validate_accepts_the_reference_solution_and_refuses_a_wrong_one(tmp_path):
    nbgrader()
    exercise = get_exercise(CHEAP)
    right = notebook_with(tmp_path, exercise, solution(CHEAP), f"right/{exercise.notebook_name}")
    wrong = notebook_with(tmp_path, exercise, WRONG.source(), f"wrong/{exercise.notebook_name}")

    output = run_nbgrader(tmp_path, "validate", str(right.relative_to(tmp_path)))
    assert verdicts(output) == {exercise.notebook_name: ALL_PASS}, output

    output = run_nbgrader(tmp_path, "validate", str(wrong.relative_to(tmp_path)))
    verdict = verdicts(output)[exercise.notebook_name]
    assert verdict.startswith("VALIDATION FAILED ON 1 CELL(S)!") and f'check("{CHEAP}")' in verdict, output
    assert "Partial credit; passed some but not all of the tests" in verdict
    # nbgrader's runs are not the learner's attempts: nothing recorded
    assert ProgressStore().load()["exercises"] == {}


@pytest.mark.slow
def test_release_keeps_the_stub_and_autograde_records_the_graders_score(tmp_path):
    nbgrader()
    exercise = get_exercise(CHEAP)
    (tmp_path / "nbgrader_config.py").write_text('c = get_config()\nc.CourseDirectory.course_id = "dpteach"\n')
    notebook_with(tmp_path, exercise, exercise.stub.rstrip(), f"source/ex{CHEAP}/{exercise.notebook_name}")
    run_nbgrader(tmp_path, "generate_assignment", f"ex{CHEAP}", "--ClearSolutions.enabled=False")
    released = nbformat.read(tmp_path / "release" / f"ex{CHEAP}" / exercise.notebook_name, as_version=4)
    assert tagged(released, "solution")[0].source == exercise.stub.rstrip()
    assert all("checksum" in cell.metadata.nbgrader for cell in released.cells if "nbgrader" in cell.metadata)

    # a learner's submission: the released notebook with a partly wrong answer in the solution cell
    (tagged(released, "solution")[0]).source = WRONG.source()
    submitted = tmp_path / "submitted" / "alice" / f"ex{CHEAP}" / exercise.notebook_name
    submitted.parent.mkdir(parents=True)
    nbformat.write(released, submitted)
    run_nbgrader(tmp_path, "autograde", f"ex{CHEAP}", "--create")

    graded = nbformat.read(tmp_path / "autograded" / "alice" / f"ex{CHEAP}" / exercise.notebook_name, as_version=4)
    table = "".join(out.get("text", "") for out in tagged(graded, "check")[0].outputs if out.output_type == "stream")
    total = re.search(rf"total (\d+)/{exercise.max_score}  -> failed", table)
    assert total and 0 < int(total.group(1)) < exercise.max_score, table
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}", "dpteach") as gradebook:
        graded_in_nbgrader = gradebook.find_submission(f"ex{CHEAP}", "alice")
        assert (graded_in_nbgrader.score, graded_in_nbgrader.max_score) == (int(total.group(1)), exercise.max_score)
    assert ProgressStore().load()["exercises"] == {}
