"""The exercise notebooks run top to bottom: untouched (check() says "not attempted", nothing raises) and
with a solution written in (check() grades it from the notebook's own definitions; a class defined in
a notebook is covered in test_grading_failures.py, graded from a namespace as check() does).

The notebooks are executed one after another in a single kernel, each starting from an empty namespace
(``%reset -f``): what ``pytest --nbval-lax exercises/`` does cell for cell, without paying a kernel start
per notebook.
"""
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from dpteach.grading import all_exercises
from answers.solutions import solution
from dpteach.progress import ProgressStore

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def own_progress_file(tmp_path, monkeypatch):
    """Each test its own progress store (the session-wide throwaway file is shared between tests)."""
    monkeypatch.setenv("DPTEACH_PROGRESS", str(tmp_path / "progress.json"))


def run(notebook) -> nbformat.NotebookNode:
    NotebookClient(notebook, timeout=240, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT)}}).execute()
    return notebook


def merge_exercises(keep) -> nbformat.NotebookNode:
    """One notebook of every exercise's cells that ``keep(exercise, cell)`` accepts, each exercise
    starting from a clean namespace (one kernel start instead of eight)."""
    merged = nbformat.v4.new_notebook()
    for exercise in all_exercises():
        notebook = nbformat.read(ROOT / "exercises" / exercise.notebook_name, as_version=4)
        merged.cells.append(nbformat.v4.new_code_cell("%reset -f"))
        merged.cells.extend(cell for cell in notebook.cells if keep(exercise, cell))
    return merged


def outputs(cell) -> str:
    return "".join(o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in cell.get("outputs", []))


@pytest.mark.slow
def test_untouched_notebooks_run_top_to_bottom_and_say_not_attempted():
    def keep(exercise, cell):
        # A try cell that starts ranks runs the same code in the test below, with the solution in;
        # here only exercise 01's does, for the path where the stub's NotImplementedError comes back
        # from the ranks - each launch costs seconds.
        launches = "dpteach.launch" in cell.source and exercise.id != "01"
        return cell.cell_type == "code" and not ("try" in cell.metadata.get("tags", []) and launches)

    merged = merge_exercises(keep)
    run(merged)  # raises CellExecutionError if any cell raises
    checks = [outputs(c) for c in merged.cells if "check" in c.metadata.get("tags", [])]
    tries = [outputs(c) for c in merged.cells if "try" in c.metadata.get("tags", [])]
    assert len(checks) == len(all_exercises()) and all("not attempted" in text for text in checks)
    assert len(tries) >= 3 and all(("NotImplementedError" in text or "Not written yet" in text) for text in tries), tries
    assert ProgressStore().load()["exercises"] == {}


@pytest.mark.slow
def test_with_solutions_written_in_the_try_cells_work_and_check_grades_the_notebooks_definitions():
    def keep(exercise, cell):
        tags = cell.metadata.get("tags", [])
        if "solution" in tags:
            cell.source = solution(exercise.id)
        # grading itself is covered by test_grading_solutions.py: one check cell is enough here
        return "solution" in tags or "try" in tags or ("check" in tags and exercise.id == "03")

    merged = merge_exercises(keep)
    run(merged)
    tries = [outputs(c) for c in merged.cells if "try" in c.metadata.get("tags", [])]
    assert not any("Not working yet" in text or "stub" in text or "Not written" in text for text in tries), tries
    table = outputs(next(c for c in merged.cells if "check" in c.metadata.get("tags", [])))
    exercise = next(e for e in all_exercises() if e.id == "03")
    assert f"total {exercise.max_score}/{exercise.max_score}  -> passed" in table, table
    assert "hidden checks (cases not shown)" in table
    entry = ProgressStore().load()["exercises"][exercise.stem]
    assert (entry["best_score"], entry["attempts"], entry["last_status"]) == (exercise.max_score, 1, "passed")
