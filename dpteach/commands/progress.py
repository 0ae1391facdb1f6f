"""``dpteach progress``: how far the learner is - quiz items per topic and exercise grades.

Reads the progress store that the quizzes and the exercise grader write: ``$DPTEACH_PROGRESS``, else the
course workspace this is run in (``dpteach lab`` keeps each workspace's progress in its ``.dpteach/``
folder), else ``~/.dpteach/progress.json`` (``dpteach/progress.py``); ``--workspace DIR`` reads DIR's. Where the quiz bank can be read, each topic also shows how many
items it holds, so "3 answered" reads as "3 of 6". Every exercise is listed, graded or not, with
the command that grades it.
"""
from __future__ import annotations

import argparse
import json

from dpteach.progress import ProgressStore


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--workspace", metavar="DIR", default=None,
                        help="read the progress kept in this course workspace (default: the one this is run in)")


def _items_per_topic() -> dict[str, int]:
    """Bank size per topic, or {} when the bank is missing or broken (progress still prints)."""
    try:
        from dpteach.quiz.bank import load_bank
        bank = load_bank()
    except (ValueError, OSError):
        return {}
    counts: dict[str, int] = {}
    for item in bank.items:
        counts[item.topic] = counts.get(item.topic, 0) + 1
    return counts


def _exercise_stems() -> list[str]:
    """Every exercise's notebook stem, in course order (the progress store's keys)."""
    from dpteach.grading.spec import all_exercises
    return [exercise.stem for exercise in all_exercises()]


def run(args) -> int:
    from pathlib import Path

    from dpteach.progress import WORKSPACE_MARK, default_progress_path
    if args.workspace is not None and not (Path(args.workspace).expanduser() / WORKSPACE_MARK).is_file():
        raise ValueError(f"--workspace {args.workspace!r} is not a course workspace (no {WORKSPACE_MARK} in it): "
                         f"give the folder `dpteach lab` prepared, ~/dpteach-course by default")
    where = default_progress_path(Path(args.workspace).expanduser()) if args.workspace is not None else None
    store = ProgressStore(where)
    summary = store.summary()
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"Progress ({store.path})")
    totals = _items_per_topic()
    topics = list(dict.fromkeys([*totals, *summary["quiz"]]))
    print("\nQuizzes")
    if not topics:
        print("  no quiz answered yet: try `dpteach quiz` or quiz.show(...) in a notebook")
    for topic in topics:
        row = summary["quiz"].get(topic, {"answered": 0, "correct": 0, "attempts": 0})
        of_total = f" of {totals[topic]}" if topic in totals else ""
        print(f"  {topic:<18} {row['answered']:>3}{of_total} answered, {row['correct']:>3} correct")
    print("\nExercises")
    graded = summary["exercises"]
    names = list(dict.fromkeys([*_exercise_stems(), *graded]))
    for name in names:
        if name in graded:
            row = graded[name]
            print(f"  {name:<34} best {row['best']:g} / {row['max']:g}  "
                  f"({row['attempts']} attempts, last: {row['status']})")
        else:
            print(f"  {name:<34} not graded yet: dpteach grade exercises/{name}.ipynb")
    if not names:
        print("  no exercise graded yet")
    return 0
