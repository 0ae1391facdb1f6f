"""Write the exercise notebooks from their definitions in ``dpteach/grading/checks/``.

    python exercises/build.py            # (re)write every exercises/NN_*.ipynb
    python exercises/build.py --check    # exit 1 if a notebook differs from what would be written

The notebooks are generated, not edited by hand, for one reason: the stub cell must be character for
character the stub the grader compares against (that is how it tells "not attempted" from an attempt),
and every notebook must have the same shape - intro, the stub cell tagged ``solution``, a cell that tries
the code on a small world, and ``check()``. Change the text in the exercise's module, then run this.
Notebooks are written with no outputs and with stable cell ids, so a rebuild that changes nothing
changes no byte.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a clone without installing

from dpteach.commands.lab import kernel_metadata  # noqa: E402
from dpteach.grading.spec import all_exercises  # noqa: E402

TRY_TEXT = """\
## Try it

The cell below runs your code on a small world of real ranks (each a separate process) and prints what
each rank got. Change it as you like - print inside your function, try other sizes - it is not graded.
It runs gloo ranks on the CPU, as `check()` does, whatever GPUs this machine has: the exercise is about
the messages, and on a machine with one GPU, W ranks on it would each open a CUDA context of their own
and take turns on it."""

LOCAL_TRY_TEXT = """\
## Try it

The cell below calls your functions right here, in this notebook's own process, on small inputs, and
prints what they return: these functions compute on one rank's data and need no world to run. `check()`
then runs them on real ranks too. Change the cell as you like - it is not graded."""


def try_text(exercise) -> str:
    """What the try cell really does: start a world of ranks, or call the functions in this process."""
    return TRY_TEXT if "dpteach.launch(" in exercise.try_code else LOCAL_TRY_TEXT

CHECK_TEXT = """\
## Check

`check("{id}")` runs your code on real worlds of 1 to 4 ranks: visible checks (their cases are named) and
hidden ones (other sizes, dtypes and worlds, not named), each with a time limit, so an endless loop or a
deadlock shows up as "timed out" instead of hanging the notebook. The table gives each check's points, a
hint for each failure, and the total; the best score is kept in your progress (`dpteach progress`).
From a terminal: `dpteach grade exercises/{stem}.ipynb`."""


def build(exercise) -> nbformat.NotebookNode:
    cells = [
        new_markdown_cell(exercise.intro.rstrip()),
        new_code_cell(exercise.stub.rstrip(), metadata={"tags": ["solution"]}),
        new_markdown_cell(try_text(exercise)),
        new_code_cell(exercise.try_code.rstrip(), metadata={"tags": ["try"]}),
        new_markdown_cell((CHECK_TEXT.format(id=exercise.id, stem=exercise.stem) + "\n\n" + exercise.after).rstrip()),
        new_code_cell(f'from dpteach.grading import check\n\ncheck("{exercise.id}")', metadata={"tags": ["check"]}),
    ]
    for number, cell in enumerate(cells):
        cell["id"] = f"ex{exercise.id}-{number}"
    # The kernel metadata JupyterLab writes when the kernel starts: with it already there, a notebook
    # does not open marked as modified (dpteach/commands/lab.py, align_kernel_metadata).
    notebook = new_notebook(cells=cells, metadata={"dpteach": {"exercise": exercise.id}, **kernel_metadata()})
    nbformat.validate(notebook)
    return notebook


def comparable(text: str) -> dict:
    """A notebook's content without the Python version in its metadata: the notebooks are the same
    exercise on every Python, and ``dpteach lab`` writes the learner's version into them."""
    notebook = json.loads(text)
    notebook.get("metadata", {}).get("language_info", {}).pop("version", None)
    return notebook


def text_of(exercise) -> str:
    return nbformat.writes(build(exercise)) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if a notebook is stale")
    args = parser.parse_args(argv)
    stale = []
    for exercise in all_exercises():
        path = HERE / exercise.notebook_name
        text = text_of(exercise)
        if args.check:
            if not path.exists() or comparable(path.read_text(encoding="utf-8")) != comparable(text):
                stale.append(path.name)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote exercises/{path.name}")
    if stale:
        print("out of date (run python exercises/build.py): " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
