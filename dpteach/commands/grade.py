"""``dpteach grade``: grade an exercise notebook in the terminal, the same way ``check()`` does in the notebook.

    dpteach grade exercises/01_ring_reduce_scatter_all_gather.ipynb     # the table
    dpteach grade 01 --json                                             # exercises/01_*.ipynb, as JSON

The code graded is the notebook's cells tagged ``solution`` - save the notebook first. Exit status: 0 on
full marks, 1 otherwise (a failed check, not attempted, an error), 2 for a bad argument. Each attempt is
recorded in the progress store (``dpteach progress``) unless ``--no-record``.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import dpteach


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="PATH",
                        help="an exercise notebook (exercises/NN_*.ipynb) or an exercise id such as 01")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--no-record", action="store_true", help="do not record the attempt in the progress store")


def exercises_folder() -> Path:
    """``exercises/`` in the current folder, else the one in the clone this package lives in."""
    here = Path.cwd() / "exercises"
    return here if here.is_dir() else Path(dpteach.__file__).resolve().parent.parent / "exercises"


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


def run(args) -> int:
    from dpteach.grading import grade_notebook

    report = grade_notebook(notebook_path(args.path), record=not args.no_record)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.text())
    return 0 if report.status == "passed" else 1
