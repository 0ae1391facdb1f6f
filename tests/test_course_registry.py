"""The course table (``dpteach/course.py``) tells the truth, and everything that lists the course agrees with it:
the notebooks (what they import, which exercises they send the learner to) and ``dpteach.experiments``' exports.
Lesson 00's map and the README's course table and module map are written from it (``scripts/course_pages.py``);
the tests here fail when they are stale, and show that the script notices a change."""
import ast
import importlib.util
import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import dpteach.experiments as experiments
from dpteach import course
from dpteach.grading import all_exercises

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")


def _course_pages():
    spec = importlib.util.spec_from_file_location("course_pages", REPO / "scripts" / "course_pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PAGES = _course_pages()  # scripts/course_pages.py: it reads the notebooks' imports as these tests do
_imports = PAGES.notebook_imports


def _markdown(notebook: str) -> str:
    cells = json.loads((REPO / "notebooks" / notebook).read_text(encoding="utf-8"))["cells"]
    return "\n".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "markdown")


def test_every_notebook_is_a_lesson_in_course_order():
    on_disk = sorted(path.name for path in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert on_disk == list(course.notebooks())
    assert [lesson.number for lesson in course.LESSONS] == [f"{i:02d}" for i in range(len(course.LESSONS))]


@pytest.mark.parametrize("lesson", course.LESSONS, ids=lambda lesson: lesson.number)
def test_a_lesson_runs_exactly_the_experiments_the_table_gives_it(lesson):
    imported = {name for module, name in _imports(lesson.notebook) if module == "dpteach.experiments"}
    assert imported == {qualified.split(".")[1] for qualified in lesson.experiments}


@pytest.mark.parametrize("lesson", course.LESSONS, ids=lambda lesson: lesson.number)
def test_a_lesson_sends_the_learner_to_its_exercises(lesson):
    by_id = {exercise.id: exercise for exercise in all_exercises()}
    text = _markdown(lesson.notebook)
    for exercise in lesson.exercises:
        assert f"../exercises/{by_id[exercise].notebook_name}" in text, (lesson.notebook, exercise)


def test_every_exercise_belongs_to_one_lesson():
    owners = [exercise for lesson in course.LESSONS for exercise in lesson.exercises]
    assert sorted(owners) == sorted(exercise.id for exercise in all_exercises())


def test_experiments_exports_every_function_of_the_table_from_its_module():
    homes = course.experiment_homes()
    assert sorted(experiments.__all__) == sorted(homes)
    for name, module in homes.items():
        function = getattr(experiments, name)
        assert callable(function) and function.__module__ == f"dpteach.experiments.{module}", name
    with pytest.raises(AttributeError, match="no attribute 'overlap_timelines'"):
        experiments.overlap_timelines  # noqa: B018


def test_the_readme_tables_and_lesson_00_map_are_written_from_the_course():
    check = subprocess.run([sys.executable, str(REPO / "scripts" / "course_pages.py"), "--check"],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    text = _markdown("00_start_here.ipynb")
    for lesson in course.LESSONS[1:]:
        assert f"[{lesson.number} · {lesson.title}]({lesson.notebook}): {lesson.question}" in text, lesson.notebook
    for exercise in all_exercises():
        assert f"(../exercises/{exercise.notebook_name})" in text, exercise.id
    rows = re.findall(r"^\| `(\d\d_\w+)` \| (.+) \|$", README, re.M)
    assert rows == [(f"{lesson.number}_{lesson.slug}", lesson.question) for lesson in course.LESSONS]


def test_a_changed_lesson_makes_the_pages_stale_and_the_module_map_names_each_module_with_its_lessons(monkeypatch):
    pages = PAGES
    changed = replace(course.LESSONS[4], question="What does overlap hide, and what does it not?")
    monkeypatch.setattr(course, "LESSONS", course.LESSONS[:4] + (changed,) + course.LESSONS[5:])
    readme = pages.readme(README)
    assert readme != README and "| `04_overlap` | What does overlap hide, and what does it not? |" in readme
    assert "What does overlap hide, and what does it not?" in pages.lesson_map()
    # a module of its own: its package's row names it, with its lesson when the course table gives it one
    assert "`accumulation` (05)" in pages.module_map() and "`knobs`" in pages.module_map()
    with pytest.raises(SystemExit, match="markers of the course table are missing"):
        pages.readme("# a README without markers\n")


def test_a_lesson_is_found_by_number_slug_or_file_and_a_wrong_one_is_named():
    assert course.lesson("4") is course.lesson("overlap") is course.lesson("04_overlap.ipynb")
    with pytest.raises(ValueError, match="lesson='31' is not a lesson of this course"):
        course.lesson("31")


def _sibling_imports(package: Path) -> dict:
    """``{module: {modules of the same package it imports}}`` for every module of ``package``."""
    found = {}
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found[path.stem] = {node.module.split(".")[0] if node.module else alias.name
                            for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 1
                            for alias in node.names}
    return found


def test_experiments_stand_on_two_floors_and_no_lesson_imports_another():
    imports = _sibling_imports(REPO / "dpteach" / "experiments")
    lessons = {qualified.split(".")[0] for lesson in course.LESSONS for qualified in lesson.experiments}
    for module, used in imports.items():
        if module in lessons:
            assert not used & lessons - {module}, (module, used & lessons)
        for below in used - {"__init__"}:
            assert not imports[below] - {"__init__"}, f"{module} -> {below} -> {imports[below]}: a third floor"


def _module_map() -> dict:
    """The README's module map: first column (the paths, in backticks) -> the row's text."""
    rows = {}
    text = README
    table = text[text.index("| module | read it for |"):]
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        first, rest = line.split("|")[1:3]
        for path in re.findall(r"`([^`]+)`", first):
            rows[path] = rest
    return rows


def test_the_readme_module_map_names_every_file_of_the_package():
    """A new module must be placed on the map: by its own row, or named in its folder's row."""
    rows = _module_map()
    for path in rows:
        assert (REPO / path).exists(), f"the README's module map names {path}, which does not exist"
    package = REPO / "dpteach"
    missing = []
    for file in sorted(package.rglob("*.py")):
        relative = file.relative_to(REPO).as_posix()
        if file.name == "__init__.py" and file.parent != package or relative in rows:
            continue
        folder = next((p for p in rows if p.endswith("/") and relative.startswith(p)), None)
        inside = file.relative_to(REPO / folder).as_posix() if folder else None
        if folder is None or not re.search(rf"`{re.escape(inside)}`|`{re.escape(inside[:-3])}`|"
                                           rf"`{re.escape(file.parent.relative_to(REPO / folder).as_posix())}/`",
                                           rows[folder]):
            missing.append(relative)
    assert not missing, f"not on the README's module map: {missing}"
