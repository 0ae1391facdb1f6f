"""Write the course's lists that would otherwise be copied by hand: the README's course table and module map, and
lesson 00's map of the course, from ``dpteach/course.py``, the exercises and the package faces.

    python scripts/course_pages.py          # rewrite what is out of date
    python scripts/course_pages.py --check  # exit 1 and name it, changing nothing (the test runs this)

Each list sits between two marker comments in its file (``<!-- NAME: written by scripts/course_pages.py -->`` and
``<!-- end of NAME -->``); the text around them is written by hand. The module map's rows come bottom to top in
``LAYERS``, the one place the library's layering is declared: a module may import from its own row and the rows
above it (``tests/test_module_map.py`` holds the code to that). A package's row is its face's first paragraph
and its modules' names; each module's own line is on the face (``scripts/package_faces.py``).
"""
from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nbformat  # noqa: E402

import dpteach  # noqa: E402
from dpteach import course  # noqa: E402  (the repository's own package, not an installed one)
from dpteach.grading.spec import all_exercises  # noqa: E402

README = ROOT / "README.md"
LESSON_00 = ROOT / "notebooks" / course.LESSONS[0].notebook

# The library, bottom to top: each row's paths. A row may import from itself and the rows above it.
LAYERS = (
    ("dpteach/course.py",), ("dpteach/validate.py",), ("dpteach/measure.py",), ("dpteach/units.py",),
    ("dpteach/progress.py",), ("dpteach/front_end.py",), ("dpteach/materials.py", "dpteach/workspace.py"),
    ("dpteach/ranks/",),
    ("dpteach/__init__.py",), ("dpteach/collectives/",), ("dpteach/network/",), ("dpteach/replica/",),
    ("dpteach/sync/",), ("dpteach/training/",), ("dpteach/profiling/",), ("dpteach/experiments/",),
    ("dpteach/devicecheck/",),
    ("dpteach/quiz/",), ("dpteach/widgets/",), ("dpteach/grading/",),
    ("dpteach/commands/", "dpteach/cli.py", "dpteach/__main__.py"),
)
SHARED_WIDGETS = ("rendering", "panel")  # every lesson's: not listed by lesson


def docstring(path: Path) -> str:
    source = path / "__init__.py" if path.is_dir() else path
    return ast.get_docstring(ast.parse(source.read_text(encoding="utf-8"))) or ""


def first_paragraph(path: Path) -> str:
    """A module's (or package's) docstring's first paragraph on one line, in Markdown's backticks."""
    return " ".join(docstring(path).strip().split("\n\n")[0].split()).replace("``", "`")


def modules_of(folder: Path) -> list[str]:
    return [p.stem for p in sorted(folder.glob("*.py")) if p.name != "__init__.py"] + \
        [p.name + "/" for p in sorted(folder.iterdir()) if (p / "__init__.py").is_file()]


def spans(numbers) -> str:
    """{"01", "02", "03", "05"} -> "01-03, 05"."""
    values, parts = sorted(int(n) for n in numbers), []
    for value in values:
        if parts and parts[-1][1] == value - 1:
            parts[-1][1] = value
        else:
            parts.append([value, value])
    return ", ".join(f"{a:02d}" if a == b else f"{a:02d}-{b:02d}" for a, b in parts)


def notebook_imports(notebook: str) -> list[tuple[str, str]]:
    """(module, name) for every ``from dpteach... import name`` in a lesson's code cells."""
    cells = json.loads((ROOT / "notebooks" / notebook).read_text(encoding="utf-8"))["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    code = "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))
    return [(node.module, alias.name) for node in ast.walk(ast.parse(code))
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dpteach") for alias in node.names]


def experiments_by_module() -> dict[str, set]:
    found: dict = {}
    for lesson in course.LESSONS:
        for qualified in lesson.experiments:
            found.setdefault(qualified.split(".")[0], set()).add(lesson.number)
    return found


def widgets_by_module() -> dict[str, set]:
    found: dict = {}
    for lesson in course.LESSONS:
        for module, name in notebook_imports(lesson.notebook):
            widget = module.split(".")[2] if module.startswith("dpteach.widgets.") else (
                name if module == "dpteach.widgets" and name != "ExperimentPanel" else None)
            if widget is not None and widget not in SHARED_WIDGETS:
                found.setdefault(widget, set()).add(lesson.number)
    return found


def _listed(names, lessons: dict | None = None) -> str:
    if lessons is None:
        return ", ".join(f"`{name}`" for name in names)
    by_lesson = sorted((n for n in names if n in lessons), key=lambda n: (min(lessons[n]), n))
    rest = [n for n in names if n not in lessons]
    text = "; ".join(f"`{name}` ({spans(lessons[name])})" for name in by_lesson)
    return text + (f"; and, shared by lessons: {_listed(rest)}" if rest else "")


def row(paths: tuple) -> str:
    cells = []
    for path in paths:
        target = ROOT / path
        if path == "dpteach/__init__.py":  # the package's front door: what a notebook imports from it
            names = ", ".join(f"`{name}`" for name in dpteach._EXPORTS)
            cells.append(f"The names a notebook imports from `dpteach` (each module imported on first use): {names}.")
            continue
        if not path.endswith("/"):
            what = first_paragraph(target)
            cells.append(what if len(paths) == 1 else f"`{Path(path).name}`: {what}")
            continue
        lessons = {"dpteach/experiments/": experiments_by_module(),
                   "dpteach/widgets/": widgets_by_module()}.get(path)
        what = "By lesson (written once, in `dpteach/course.py`)" if path == "dpteach/experiments/" else \
            "By the lessons that import them" if lessons is not None else "Its modules"
        cells.append(f"{first_paragraph(target)} {what}: {_listed(modules_of(target), lessons)}.")
    first = ", ".join(f"`{path}`" for path in paths)
    return f"| {first} | {' '.join(cells)} |"


def module_map() -> str:
    return "\n".join(["| module | read it for |", "|---|---|", *(row(paths) for paths in LAYERS)])


def course_table() -> str:
    return "\n".join(["| notebook | the question it answers by running it |", "|---|---|",
                      *(f"| `{lesson.number}_{lesson.slug}` | {lesson.question} |" for lesson in course.LESSONS)])


def lesson_map() -> str:
    """Lesson 00's map: every other lesson with its question and the exercises it sends the learner to."""
    exercises = {exercise.id: exercise for exercise in all_exercises()}
    lines = []
    for lesson in course.LESSONS[1:]:
        line = f"* [{lesson.number} · {lesson.title}]({lesson.notebook}): {lesson.question}"
        if lesson.exercises:
            line += " Exercises: " + ", ".join(f"[{exercises[i].title}](../exercises/{exercises[i].notebook_name})"
                                               for i in lesson.exercises) + "."
        lines.append(line)
    return "\n".join(lines)


def _between(text: str, name: str, body: str, where: str) -> str:
    start, end = f"<!-- {name}: written by scripts/course_pages.py -->", f"<!-- end of {name} -->"
    if start not in text or end not in text:
        raise SystemExit(f"{where}: the markers of the {name} are missing ({start} ... {end})")
    head, rest = text.split(start, 1)
    return head + start + "\n" + body + "\n" + end + rest.split(end, 1)[1]


def readme(text: str) -> str:
    return _between(_between(text, "course table", course_table(), "README.md"), "module map", module_map(),
                    "README.md")


def lesson_00(notebook) -> str:
    """The notebook's text with its map cell rewritten; the other cells as they are."""
    for cell in notebook.cells:
        if cell.cell_type == "markdown" and "<!-- course map:" in cell.source:
            cell.source = _between(cell.source, "course map", lesson_map(), LESSON_00.name)
            return nbformat.writes(notebook) + "\n"
    raise SystemExit(f"{LESSON_00.name}: no markdown cell holds the course map's markers")


def pages() -> dict[Path, str]:
    """Every page this script writes: path -> its up-to-date text."""
    return {README: readme(README.read_text(encoding="utf-8")),
            LESSON_00: lesson_00(nbformat.read(LESSON_00, as_version=4))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a page is out of date")
    args = parser.parse_args(argv)
    stale = [path for path, text in pages().items() if text != path.read_text(encoding="utf-8")]
    if args.check and stale:
        print("out of date (run python scripts/course_pages.py): " +
              ", ".join(p.relative_to(ROOT).as_posix() for p in stale), file=sys.stderr)
        return 1
    for path in stale if not args.check else ():
        path.write_text(pages()[path], encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
