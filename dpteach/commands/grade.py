"""``dpteach grade``: grade an exercise notebook in the terminal, the same way ``check()`` does in the notebook.

    dpteach grade exercises/01_ring_reduce_scatter_all_gather.ipynb     # the table
    dpteach grade 01 --json                                             # exercises/01_*.ipynb, as JSON
    dpteach grade 01 --format gradescope --output results.json          # Gradescope's results.json
    dpteach grade --submission /autograder/submission --exercise 01 --format gradescope ...

The code graded is the notebook's cells tagged ``solution`` - save the notebook first. ``NN`` means
``exercises/NN_*.ipynb`` in the current folder, else in your workspace (``dpteach lab``), else in the
course as shipped. Exit status: 0 on full marks, 1 otherwise (a failed check, not attempted, an error),
2 for a bad argument. Each attempt is recorded in the progress store (``dpteach progress``) unless
``--no-record``. ``dpteach autograder`` writes the Gradescope bundle that calls this.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

FORMATS = ("table", "json", "gradescope")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="PATH", nargs="?", default=None,
                        help="an exercise notebook (exercises/NN_*.ipynb) or an exercise id such as 01")
    parser.add_argument("--submission", metavar="DIR", default=None,
                        help="grade the exercise's notebook found in this folder (a Gradescope submission)")
    parser.add_argument("--exercise", metavar="ID", default=None,
                        help="the exercise the notebook is (default: what the notebook says, or its file name)")
    parser.add_argument("--format", choices=FORMATS, default=None, help="how to print the grade (default: table)")
    parser.add_argument("--json", action="store_true", help="the same as --format json")
    parser.add_argument("--output", metavar="FILE", default=None, help="write the grade to FILE instead of printing it")
    parser.add_argument("--no-record", action="store_true", help="do not record the attempt in the progress store")


def exercises_folder() -> Path:
    """``exercises/`` in the current folder, else the learner's workspace's, else the course's own."""
    from .. import materials
    from ..workspace import default_workspace

    for folder in (Path.cwd() / "exercises", default_workspace() / "exercises"):
        if folder.is_dir():
            return folder
    return materials.course_root() / "exercises"


def notebook_path(argument: str) -> Path:
    """The notebook that ``argument`` names: a path to a notebook, or an exercise id / stem."""
    from dpteach.grading import get_exercise

    path = Path(argument)
    if path.is_file():
        return path
    if path.suffix == ".ipynb" or "/" in argument or "\\" in argument:
        raise ValueError(f"PATH {argument!r} does not exist: give an exercise notebook (exercises/NN_*.ipynb) "
                         f"or an exercise id such as 01")
    try:
        exercise = get_exercise(argument)
    except ValueError as exc:
        raise ValueError(f"PATH {argument!r} is neither a notebook file nor an exercise id: {exc}") from None
    candidate = exercises_folder() / exercise.notebook_name
    if not candidate.is_file():
        raise ValueError(f"PATH {argument!r} means {exercise.notebook_name}, which is not in {candidate.parent}; "
                         f"give the notebook's path instead")
    return candidate


def _emit(text: str, output: str | None) -> None:
    if output is None:
        print(text)
    else:
        from ..progress import write_text_atomically
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(Path(output), text + "\n")


def run(args) -> int:
    from dpteach.grading import get_exercise, grade_notebook
    from dpteach.grading.gradescope import failure_results, find_submission, results_json

    form = "json" if args.json and args.format in (None, "json") else (args.format or "table")
    if args.json and form != "json":
        raise ValueError(f"--json and --format {args.format} disagree: give one of them")
    if (args.path is None) == (args.submission is None):
        raise ValueError("give PATH (a notebook or an exercise id) or --submission DIR, and not both")
    exercise = get_exercise(args.exercise) if args.exercise else None
    if args.submission is not None and exercise is None:
        raise ValueError("--submission needs --exercise: which exercise the submitted notebook is")
    path = notebook_path(args.path) if args.path is not None else None  # a bad PATH is a bad argument
    try:
        path = path or find_submission(Path(args.submission), exercise)
        # A submission is someone else's work: grading it (an instructor, an autograder) is nobody's progress here.
        record = not args.no_record and args.submission is None
        report = grade_notebook(path, exercise.id if exercise else None, record=record)
    except ValueError as exc:  # nothing to grade: no notebook, an unreadable one, one of another exercise
        if form != "gradescope":
            raise
        _emit(json.dumps(failure_results(f"Nothing was graded: {exc}"), indent=2), args.output)  # Gradescope
        return 1                                                                         # shows why
    if form == "gradescope":
        _emit(json.dumps(results_json(report), indent=2), args.output)
    elif form == "json":
        _emit(json.dumps(report.to_json(), indent=2), args.output)
    else:
        _emit(report.text(), args.output)
    return 0 if report.status == "passed" else 1
