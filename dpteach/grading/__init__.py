"""Exercises that grade themselves by running the learner's code on real multi-rank worlds.

In an exercise notebook, after writing the stub's function(s)::

    from dpteach.grading import check
    check("01")          # prints a table: each check, its points, a hint for each failure, the total

(Under nbgrader, ``check`` also returns the score, for nbgrader's gradebook: see its docstring.)

In a terminal: ``dpteach grade exercises/01_ring_reduce_scatter_all_gather.ipynb [--json]``.

No grading server, database or JupyterHub: the checks run here, on this machine's CPU cores, in real
gloo process groups of 1 to 4 ranks (``runner.py``, ``in_rank.py``), with a time limit per check, hidden
cases, and a guard against calling the built-in collective the exercise asks you to build
(``forbidden.py`` reads the code, ``guard.py`` watches it run). Every check is judged twice - in the ranks,
and again from what they recorded in a process where no learner code ran (``replay.py``, ``judge.py``) -
and code that changes how the checks judge scores 0 (``seal.py``, ``tampering.py``). Scores go to the
same progress store as the quizzes (``dpteach progress``).

For tools: :func:`grade_notebook` (a notebook file), :func:`grade_source` (the text of a solution cell) and
:func:`grade_namespace` (a dict of the learner's objects) return a :class:`~dpteach.grading.report.Report`
instead of printing.

Its modules, one line each (``scripts/package_faces.py`` writes this list from their docstrings):

* ``forbidden``: The static half of "build it yourself": read the learner's code for collectives the exercise
  forbids.
* ``forked_worlds``: Ranks forked from one grading rank, joined by gloo, that die for real: the worlds a check of
  what survives a kill runs in (exercise 10's).
* ``gradescope``: The grade as Gradescope reads it: ``results.json``, and the autograder bundle that writes it.
* ``guard``: The run-time half of "build it yourself": inside each rank, catch calls to the collectives an exercise
  forbids.
* ``in_rank``: What runs inside each rank while an exercise is graded.
* ``judge``: The clean process that judges every check again, and the rule that only two passes make a pass.
* ``learner``: How a check reaches the learner's code inside a rank: the context a check's ``run(ctx)`` is given.
* ``notebook``: Getting the learner's code out of an exercise, and telling whether they have touched it yet.
* ``replay``: The verdict, reached again where no learner code has run: record in the rank, replay in a clean
  process.
* ``report``: The grade, as a table for people and as JSON for tools.
* ``runner``: Grade a submission: read it, run its checks on real ranks, and turn what happened into a report.
* ``salts``: Secret salts: chosen by the parent process, known inside each rank for that rank alone, and given to
  the judge for every rank.
* ``seal``: Notice when a solution rewires what the checks judge with, before the check judges.
* ``spec``: What an exercise is, for the grader: the names the learner writes, the stub they start from, the checks.
* ``tampering``: What the learner's code does to the grader around it, seen as it happens: Python's audit events.
* ``tryout``: What an exercise's "try it" cell does when the learner's code is not working yet.
* ``verdicts``: How the ranks' records of one check become its row in the report: merged when the check finished on
  every rank, blamed when its world died first.
* ``watchdog``: A rank's plumbing: its signed results file, the watchdog that keeps time limits, the store barrier,
  and running one submission in a process of its own.
* ``checks/``: The exercises' checks, one module per exercise (``exNN_*.py``), each defining ``EXERCISE``.
"""
from __future__ import annotations

import inspect
import os
from pathlib import Path

from .notebook import exercise_of_notebook, from_namespace, from_notebook_file, from_source
from .report import Report
from .runner import grade, grade_many
from .spec import Exercise, all_exercises, get_exercise
from .tryout import explain_failures

# Set by nbgrader while it runs a notebook to validate or autograde it ("validate", "autograde").
NBGRADER_EXECUTION = "NBGRADER_EXECUTION"

__all__ = ["check", "explain_failures", "grade_notebook", "grade_source", "grade_sources", "grade_namespace", "get_exercise", "all_exercises", "Report", "Exercise"]


def grade_notebook(path, exercise: str | None = None, *, record: bool = True) -> Report:
    """Grade the cells tagged ``solution`` in the notebook at ``path``.

    The exercise is ``exercise`` if given, else the one the notebook declares in its metadata, else the
    one whose notebook file name it carries (``01_...ipynb``).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"path={str(path)!r} is not a file: give an exercise notebook "
                         f"(exercises/NN_*.ipynb) or an exercise id such as 01")
    key = exercise or exercise_of_notebook(path) or path.name.split("_")[0]
    chosen = get_exercise(key)
    return grade(chosen, from_notebook_file(chosen, path), record=record)


def grade_source(exercise: str, source: str, *, record: bool = True, only=None,
                 limit_scale: float | None = None) -> Report:
    """Grade ``source`` as if it were the text of the notebook's solution cell (for tools and tests)."""
    chosen = get_exercise(exercise)
    return grade(chosen, from_source(chosen, source), record=record, only=only, limit_scale=limit_scale)


def grade_sources(exercise: str, sources: list, *, limit_scale: float | None = None) -> list[Report]:
    """Grade several ``(source, only)`` pairs of one exercise in as few worlds as possible; not recorded.

    For the grader's own tests, and for an instructor checking many submissions at once.
    """
    chosen = get_exercise(exercise)
    return grade_many(chosen, [(from_source(chosen, text), only) for text, only in sources], record=False,
                      limit_scale=limit_scale)


def grade_namespace(exercise: str, namespace: dict, *, record: bool = True, only=None) -> Report:
    """Grade the learner's objects found by name in ``namespace`` (a notebook's globals)."""
    chosen = get_exercise(exercise)
    try:
        submission = from_namespace(chosen, namespace)
    except NameError as missing:
        from .report import not_attempted
        report = not_attempted(chosen)
        report.status, report.error = "error", str(missing)
        return report
    return grade(chosen, submission, record=record, namespace=namespace, only=only)


def check(exercise: str, namespace: dict | None = None, *, record: bool | None = None) -> int | None:
    """Grade exercise ``exercise`` from the calling notebook's definitions and print the table.

    ``namespace`` defaults to the caller's globals, i.e. the notebook. Returns nothing (so that the
    table is not printed twice); use :func:`grade_namespace` to get the report as an object.

    Under nbgrader (``nbgrader validate``, ``nbgrader autograde``, or the Validate button of its
    assignment list), the table is printed all the same, and ``check`` then returns the score, an int:
    as the last expression of the exercise's check cell - an nbgrader "autograder tests" cell worth the
    exercise's total points (``exercises/build.py``) - that value is nbgrader's partial credit for the
    cell, so nbgrader's gradebook holds this grader's score, and a score below the total fails
    ``nbgrader validate``. nbgrader says it is running a notebook by the environment variable
    ``NBGRADER_EXECUTION`` (``"validate"`` or ``"autograde"``: nbgrader 0.9's ``validator.py`` and
    ``converters/autograde.py``, documented in its FAQ, "Can I modify the notebook behavior during
    autograding or validation?"); it reads a test cell's ``execute_result`` as points
    (``nbgrader.utils.determine_grade`` / ``get_partial_grade``, jupyter/nbgrader#1090), and a cell with an
    error or anything on stderr as 0. Nothing is raised either way.

    ``record`` (whether the score goes to the progress store, ``dpteach progress``) defaults to true,
    except under nbgrader: its autograder runs every learner's notebook on the instructor's account,
    where the attempts are nobody's progress.
    """
    if namespace is None:
        namespace = inspect.currentframe().f_back.f_globals
    under_nbgrader = bool(os.environ.get(NBGRADER_EXECUTION))
    if record is None:
        record = not under_nbgrader
    report = grade_namespace(exercise, namespace, record=record)
    print(report.text())
    return report.score if under_nbgrader else None
