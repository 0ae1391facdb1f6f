"""``dpteach autograder``: write a Gradescope autograder for one exercise.

    dpteach autograder 04 --out gradescope-04 --wheel dist/dpteach-0.1.0-py3-none-any.whl

writes ``setup.sh`` (installs the course CPU-only), ``run_autograder`` (grades the submitted notebook
on real ranks into ``/autograder/results/results.json``) and ``autograder.zip`` holding them - upload the
zip as the assignment's autograder. Without ``--wheel``, setup.sh installs ``dpteach`` from PyPI, which
needs a published release. How the grade maps onto Gradescope's fields: ``dpteach/grading/gradescope.py``.
"""
from __future__ import annotations

from pathlib import Path


def add_arguments(parser) -> None:
    parser.add_argument("exercise", metavar="EXERCISE", help="an exercise id such as 04")
    parser.add_argument("--out", metavar="DIR", default=None, help="where to write it (default: gradescope-EXERCISE)")
    parser.add_argument("--wheel", metavar="FILE", default=None,
                        help="a dpteach wheel to put in the bundle and install (default: dpteach from PyPI, once released)")
    parser.add_argument("--torch", metavar="SPEC", default="torch",
                        help="the torch requirement setup.sh installs from the CPU index (default: torch)")


def run(args) -> int:
    from dpteach.grading import get_exercise
    from dpteach.grading.gradescope import write_bundle

    exercise = get_exercise(args.exercise)
    out = Path(args.out or f"gradescope-{exercise.id}")
    written = write_bundle(exercise.id, out, wheel=Path(args.wheel) if args.wheel else None, torch=args.torch)
    print(f"Autograder for exercise {exercise.id} ({exercise.title}) in {out}/: {', '.join(written['files'])}")
    print(f"Upload {written['zip']} as the assignment's autograder; students submit {exercise.notebook_name}.")
    return 0
