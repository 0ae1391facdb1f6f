"""Keep the exercise notebooks in shape: their standard parts, and the stub the grader compares against.

    python exercises/build.py            # rewrite the standard parts of every exercises/NN_*.ipynb
    python exercises/build.py --check    # exit 1 if a notebook differs from what would be written

Each exercise notebook is the source of its own text, and is edited as a notebook: the intro (its first
cell: what to write, the signature, the rules), the code cell tagged ``try`` that runs the learner's code
on a small world, and the text that follows the standard "Check" paragraph (what to look at next). This
script reads those back from the notebook and rewrites everything else, because everything else must
not drift:

* the cell tagged ``solution`` is ``exercise.stub`` from the exercise's module in
  ``dpteach/grading/checks/``, character for character: the grader compares the learner's cell against
  that stub to tell "not attempted" from an attempt, so the stub is grader data and is changed there;
* every notebook has the same shape - intro, stub, "Try it" text, try cell, "Check" text and the
  notebook's own next words in one cell, ``check()`` - with the same standard text (the "Try it" text
  is chosen by what the try cell does: start a world of ranks, or call the functions in this process);
* no outputs, stable cell ids, and the kernel metadata JupyterLab would write: a rebuild that changes
  nothing changes no byte;
* nbgrader's cell metadata (``NBGRADER_ROLE`` and ``nbgrader_metadata``, below), so that an nbgrader course can release and collect
  the notebooks while this course's grader stays the judge.

So: edit an exercise's text in its notebook (clear the outputs), its stub in its module, then run this.
A new exercise with no notebook yet gets one with placeholder text to replace.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a clone without installing

from dpteach.commands.lab import kernel_metadata  # noqa: E402
from dpteach.grading.notebook import cell_source, read_notebook, tagged_cells  # noqa: E402
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


def try_text(try_code: str) -> str:
    """What the try cell really does: start a world of ranks, or call the functions in this process."""
    return TRY_TEXT if "dpteach.launch(" in try_code else LOCAL_TRY_TEXT


CHECK_TEXT = """\
## Check

`check("{id}")` runs your code on real worlds of 1 to 4 ranks: visible checks (their cases are named) and
hidden ones (other sizes, dtypes and worlds, not named), each with a time limit, so an endless loop or a
deadlock shows up as "timed out" instead of hanging the notebook. The table gives each check's points, a
hint for each failure, and the total; the best score is kept in your progress (`dpteach progress`).
From a terminal: `dpteach grade exercises/{stem}.ipynb`."""

SHAPE = ("the intro (markdown)", "the stub (code, tagged solution)", "the Try it text (markdown)",
         "the try cell (code, tagged try)", "the Check text and what comes next (markdown)",
         "check() (code, tagged check)")

# nbgrader's cell metadata, schema version 3, one entry per cell of SHAPE (None: no nbgrader metadata).
# What it is and what nbgrader does with it, as read in nbgrader 0.9.6's own source:
#
# * The schema (``nbgrader/nbgraderformat/v3.json``, checked by ``v3.py``, ``MetadataValidatorV3``):
#   ``schema_version``, ``grade``, ``solution`` and ``locked`` are required; a ``grade_id`` (letters,
#   digits, ``_`` and ``-``, unique in the notebook) whenever one of the three is true; ``points`` when
#   ``grade`` is. ``checksum`` and ``cell_type`` are not ours to write: ``generate_assignment`` computes
#   them (``preprocessors/computechecksums.py``) when it makes the students' version, and
#   ``nbgrader validate`` compares them only where they are present (``validator.py``).
# * The stub cell is an "autograded answer": ``solution: true``, ``grade: false`` (its grade is the
#   check cell's), ``locked: false`` (``utils.is_locked`` ignores ``locked`` on a solution cell anyway).
# * The check cell is an "autograder tests" cell: ``grade: true`` with the exercise's total points, and
#   ``locked`` (a grade cell is locked whatever it says: ``utils.is_locked``; autograde writes the
#   released source back over it, ``preprocessors/overwritecells.py``). nbgrader scores a code test cell
#   from its outputs (``utils.determine_grade``): an error or any stderr is 0, an ``execute_result`` that
#   reads as a number is that many points, anything else is full points. So under nbgrader ``check()``
#   returns its score as the cell's value (``dpteach/grading/__init__.py``: nbgrader announces itself with
#   ``NBGRADER_EXECUTION``), and the points here must be the exercise's total for that score to fit.
# * The intro, the "Try it" text and the Check text are read-only cells (``locked: true``, nothing else):
#   generate_assignment makes them non-editable and non-deletable (``preprocessors/lockcells.py``).
# * The try cell gets no nbgrader metadata: the notebook invites learners to change it, so it stays an
#   ordinary editable cell, which nbgrader runs but neither grades nor restores.
# * Releasing: generate_assignment's ClearSolutions (``preprocessors/clearsolutions.py``) replaces a
#   solution cell without ``### BEGIN SOLUTION`` markers by its own ``raise NotImplementedError()``. These
#   notebooks hold no solution, and their stub is grader data, so a course releases them with
#   ``--ClearSolutions.enabled=False`` (``exercises/README.md``, ``tests/test_nbgrader.py``).
#
# Nothing at the notebook level: nbgrader reads only ``kernelspec`` there (``savecells.py``,
# ``clearsolutions.py``: its ``language`` must be one it knows, "python"), which ``kernel_metadata()`` writes.
NBGRADER_SCHEMA_VERSION = 3
NBGRADER_ROLE = ("intro", "solution", "try-text", None, "check-text", "check")


def nbgrader_metadata(exercise, role: str | None) -> dict | None:
    """The ``nbgrader`` cell metadata of the cell that plays ``role`` (see ``NBGRADER_ROLE``)."""
    if role is None:
        return None
    meta = {"schema_version": NBGRADER_SCHEMA_VERSION, "grade": False, "solution": False, "locked": True,
            "grade_id": f"ex{exercise.id}-{role}"}
    if role == "solution":
        meta.update(solution=True, locked=False)
    elif role == "check":
        meta.update(grade=True, points=exercise.max_score)
    return meta


@dataclass
class OwnText:
    """What an exercise notebook says in its own words; the rest of it is standard or the grader's."""

    intro: str      # the first cell: what to write, the signature, the rules
    try_code: str   # the cell tagged ``try``: runs the learner's code on a small world
    after: str      # after the standard Check paragraph, in the same cell: what to look at next


def placeholder(exercise) -> OwnText:
    """A new exercise's text until its author writes it (in the notebook)."""
    return OwnText(intro=f"# Exercise {exercise.id} - {exercise.title}\n\nWhat to write, the signature, the rules: "
                         f"replace this text.",
                   try_code="# Call your code on small inputs and print what it returns (not graded).",
                   after="What to look at next: replace this text.")


def read_own_text(exercise, path: Path) -> OwnText:
    """The notebook's own text, read back from the cells ``build`` writes it into.

    The "after" text shares its cell with the standard Check paragraph (a cell of its own would change
    every notebook), so the cell must begin with ``CHECK_TEXT`` exactly, and what follows the blank line
    after it is the notebook's. A notebook that does not have the shape ``build`` writes is refused rather
    than rewritten: rewriting it would drop the cells this script does not know.
    """
    notebook = read_notebook(path)
    cells = notebook["cells"]
    if len(cells) != len(SHAPE) or cells[0].get("cell_type") != "markdown":
        raise ValueError(f"{path.name} has {len(cells)} cells; an exercise notebook has {len(SHAPE)}: "
                         + ", ".join(SHAPE) + ". Put the text of any other cell into one of these.")
    tries = tagged_cells(notebook, "try")
    if len(tries) != 1:
        raise ValueError(f"{path.name} has {len(tries)} code cells tagged 'try'; it needs exactly one")
    standard = CHECK_TEXT.format(id=exercise.id, stem=exercise.stem)
    checks = [cell_source(cell) for cell in cells
              if cell.get("cell_type") == "markdown" and cell_source(cell).startswith(standard)]
    if len(checks) != 1:
        raise ValueError(f"{path.name} has {len(checks)} markdown cells that begin with the standard Check text "
                         f"(CHECK_TEXT in exercises/build.py); it needs one, as the notebook's closing words are "
                         f"read from what follows that text there, after a blank line")
    rest = checks[0][len(standard):]
    if rest and not rest.startswith("\n\n"):
        raise ValueError(f"{path.name}: the notebook's text after the standard Check text must start after "
                         f"a blank line")
    return OwnText(intro=cell_source(cells[0]), try_code=tries[0], after=rest[2:])


def build(exercise, own: OwnText) -> nbformat.NotebookNode:
    cells = [
        new_markdown_cell(own.intro.rstrip()),
        new_code_cell(exercise.stub.rstrip(), metadata={"tags": ["solution"]}),
        new_markdown_cell(try_text(own.try_code)),
        new_code_cell(own.try_code.rstrip(), metadata={"tags": ["try"]}),
        new_markdown_cell((CHECK_TEXT.format(id=exercise.id, stem=exercise.stem) + "\n\n" + own.after).rstrip()),
        new_code_cell(f'from dpteach.grading import check\n\ncheck("{exercise.id}")', metadata={"tags": ["check"]}),
    ]
    for number, (cell, role) in enumerate(zip(cells, NBGRADER_ROLE, strict=True)):
        cell["id"] = f"ex{exercise.id}-{number}"
        nbgrader = nbgrader_metadata(exercise, role)
        if nbgrader is not None:
            cell["metadata"]["nbgrader"] = nbgrader
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


def text_of(exercise, own: OwnText) -> str:
    return nbformat.writes(build(exercise, own)) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if a notebook is stale")
    args = parser.parse_args(argv)
    stale, texts = [], {}
    for exercise in all_exercises():  # read every notebook before writing any: a refused one stops the run
        path = HERE / exercise.notebook_name
        if args.check and not path.exists():
            stale.append(path.name)
            continue
        try:
            own = read_own_text(exercise, path) if path.exists() else placeholder(exercise)
        except ValueError as exc:
            print(f"exercises/build.py: {exc}", file=sys.stderr)
            return 2
        texts[path] = text_of(exercise, own)
    for path, text in texts.items():
        if args.check:
            if comparable(path.read_text(encoding="utf-8")) != comparable(text):
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
