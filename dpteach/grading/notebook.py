"""Getting the learner's code out of an exercise, and telling whether they have touched it yet.

The learner's code arrives one of two ways, and both end as a :class:`Submission`:

* **From a notebook file** (``dpteach grade exercises/01_....ipynb``): the code cells tagged ``solution``
  in their cell metadata. Nothing of the learner's runs in the grading process: each rank executes the
  cells itself, into a fresh module namespace, compiled under a recognisable file name such as
  ``<exercise 01 solution, cell 1>``. That name travels inside the code objects, so a traceback from a
  rank can be trimmed to the learner's own lines, and their endless loop at top level can only hang a
  rank (where a watchdog ends it), never the grader.
* **From a running notebook** (``check("01")`` in the kernel): the objects the learner defined, taken
  from the notebook's globals and sent to the ranks by value (cloudpickle). Their cells' text comes
  along, for the same trimmed tracebacks.

"Not attempted" means every name the exercise asks for is still defined exactly as the stub defines it.
"Exactly" is judged on the syntax tree, so comments and blank lines added to a stub do not count as an
attempt, and any change to the code does.
"""
from __future__ import annotations

import ast
import json
import linecache
import types
from dataclasses import dataclass, field
from pathlib import Path

from .spec import STUB_TEXT, Exercise

SOLUTION_TAG = "solution"


@dataclass
class Submission:
    """The learner's code for one exercise: cells to execute, or objects already defined."""

    exercise_id: str
    cells: list = field(default_factory=list)   # [(file name, source)] executed in order
    objects: dict | None = None                  # {name: object} when taken from a live notebook
    files: dict = field(default_factory=dict)    # file name -> source, for tracebacks and the static scan
    origin: str = ""

    def load(self) -> dict:
        """The learner's namespace, inside a rank. Registers their sources for tracebacks first."""
        for filename, source in self.files.items():
            lines = source.splitlines(keepends=True)
            linecache.cache[filename] = (len(source), None, lines, filename)
        if self.objects is not None:
            return dict(self.objects)
        module = types.ModuleType(f"dpteach_exercise_{self.exercise_id}")
        for filename, source in self.cells:
            exec(compile(source, filename, "exec"), module.__dict__)
        return module.__dict__


# -- from a notebook file --------------------------------------------------------------------------

def read_notebook(path: str | Path) -> dict:
    """The notebook as a dict; a ValueError that names the file when it is not a notebook."""
    path = Path(path)
    try:
        notebook = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"path={str(path)!r} is not a readable notebook ({exc}); give an exercise .ipynb file") from None
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise ValueError(f"path={str(path)!r} is not a Jupyter notebook (no 'cells' list); give an exercise .ipynb file")
    return notebook


def cell_source(cell: dict) -> str:
    """A cell's text (the format stores it as one string or as a list of lines)."""
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def tagged_cells(notebook: dict, tag: str, cell_type: str = "code") -> list[str]:
    """The sources of the cells of ``cell_type`` tagged ``tag``, in notebook order.

    An exercise notebook marks its cells by tag: ``solution`` (the learner's code, graded), ``try`` (the
    code that runs it on a small world, the notebook's own text) and ``check``.
    """
    return [cell_source(cell) for cell in notebook["cells"]
            if cell.get("cell_type") == cell_type and tag in cell.get("metadata", {}).get("tags", [])]


def solution_cells(notebook: dict) -> list[str]:
    """The sources of the code cells tagged ``solution``, in notebook order."""
    return tagged_cells(notebook, SOLUTION_TAG)


def from_sources(exercise: Exercise, sources: list[str], origin: str = "") -> Submission:
    """Solution cells' texts -> a submission whose code objects carry ``<exercise NN solution, cell k>``."""
    cells = [(f"<exercise {exercise.id} solution, cell {k}>", text) for k, text in enumerate(sources, 1)]
    return Submission(exercise.id, cells=cells, files=dict(cells), origin=origin)


def from_source(exercise: Exercise, source: str) -> Submission:
    return from_sources(exercise, [source], origin="source")


def from_notebook_file(exercise: Exercise, path: str | Path) -> Submission:
    sources = solution_cells(read_notebook(path))
    if not sources:
        raise ValueError(f"path={str(path)!r} has no code cell tagged '{SOLUTION_TAG}'; is it an exercise "
                         f"notebook? (the stub cell carries that tag)")
    return from_sources(exercise, sources, origin=str(path))


def exercise_of_notebook(path: str | Path) -> str | None:
    """The exercise id a notebook declares in its metadata (``dpteach.exercise``), if any."""
    return read_notebook(path).get("metadata", {}).get("dpteach", {}).get("exercise")


# -- from a live notebook --------------------------------------------------------------------------

def _code_objects(obj):
    if isinstance(obj, types.FunctionType):
        return [obj.__code__]
    if isinstance(obj, type):
        return [member.__code__ for member in vars(obj).values() if isinstance(member, types.FunctionType)]
    return []


def from_namespace(exercise: Exercise, namespace: dict) -> Submission:
    """The learner's objects from a notebook's globals, with the text of the cells that define them."""
    missing = [name for name in exercise.names if name not in namespace]
    if missing:
        raise NameError(f"define {', '.join(missing)} first: run the cell with the stub (tagged "
                        f"'{SOLUTION_TAG}') after writing your code")
    objects = {name: namespace[name] for name in exercise.names}
    files = {}
    for obj in objects.values():
        for code in _code_objects(obj):
            lines = linecache.getlines(code.co_filename)
            if lines:
                files[code.co_filename] = "".join(lines)
    return Submission(exercise.id, objects=objects, files=files, origin="notebook")


# -- attempted or not ------------------------------------------------------------------------------

def _definitions(source: str) -> dict:
    """Top-level function and class definitions of a source, by name (the last one wins, as in Python)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    return {node.name: ast.dump(node) for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def _still_stub_by_marker(obj) -> bool:
    codes = _code_objects(obj)
    return bool(codes) and all(STUB_TEXT in code.co_consts for code in codes)


def attempted(exercise: Exercise, submission: Submission) -> bool:
    """False while every name the exercise asks for is still the stub's definition."""
    stub = _definitions(exercise.stub)
    if submission.objects is None:
        defined = {}
        for _, source in submission.cells:
            defined.update(_definitions(source))
        return any(defined.get(name) != stub.get(name) for name in exercise.names)
    for name, obj in submission.objects.items():
        codes = _code_objects(obj)
        source = submission.files.get(codes[0].co_filename) if codes else None
        found = _definitions(source).get(name) if source else None
        if found is None:  # source not available: fall back to the stub's marker in the code
            if not _still_stub_by_marker(obj):
                return True
        elif found != stub.get(name):
            return True
    return False


def syntax_problem(submission: Submission) -> str | None:
    """A learner-readable description of the first syntax error in the solution cells, if any."""
    for filename, source in submission.cells:
        try:
            ast.parse(source, filename)
        except SyntaxError as exc:
            where = f"{filename}, line {exc.lineno}" if exc.lineno else filename
            text = (exc.text or "").rstrip()
            return f"SyntaxError in {where}: {exc.msg}" + (f"\n    {text}" if text else "")
    return None
