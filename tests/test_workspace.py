"""A learner's workspace (dpteach/workspace.py) and the Gradescope pieces, without installing anything.

The course "as shipped" here is a temporary copy of this repository's notebooks, exercises and quizzes
named by ``$DPTEACH_COURSE``, so a test can make the package's version newer by editing that copy.
``tests/test_install.py`` does the same from a real wheel in a fresh environment.
"""
from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest

from answers.solutions import solution
from dpteach import materials
from dpteach.cli import main
from dpteach.grading import get_exercise
from dpteach.grading.gradescope import HIDDEN_VISIBILITY, write_bundle
from dpteach.workspace import carry_solutions, prepare, replace, resolve, status

ROOT = Path(__file__).resolve().parents[1]
EXERCISE = "exercises/03_buckets.ipynb"
LESSON = "notebooks/03_bucketing.ipynb"


@pytest.fixture
def course(tmp_path, monkeypatch):
    """A copy of the course as a package would ship it, and an empty place for the workspace."""
    shipped = tmp_path / "shipped"
    for folder in materials.SHIPPED:
        shutil.copytree(ROOT / folder, shipped / folder, ignore=shutil.ignore_patterns(".*", "__pycache__"))
    monkeypatch.setenv("DPTEACH_COURSE", str(shipped))
    monkeypatch.setenv("DPTEACH_PROGRESS", str(tmp_path / "progress.json"))
    return shipped, tmp_path / "workspace"


def edit_cells(path: Path, change) -> None:
    notebook = json.loads(path.read_text())
    change(notebook)
    path.write_text(json.dumps(notebook, indent=1))


def solution_sources(path: Path) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"]
            if "solution" in c["metadata"].get("tags", [])]


def add_paragraph(notebook, text="A new paragraph."):
    notebook["cells"][0]["source"] = "".join(notebook["cells"][0]["source"]) + "\n\n" + text


def states(workspace) -> dict:
    return {row["path"]: row["state"] for row in status(workspace)}


def test_first_prepare_copies_every_lesson_and_exercise_and_later_ones_touch_nothing(course):
    shipped, workspace = course
    first = prepare(workspace)
    expected = sorted(p.relative_to(shipped).as_posix() for folder in materials.WORKSPACE_FOLDERS
                      for p in (shipped / folder).iterdir() if p.suffix == ".ipynb" or p.name == "README.md")
    assert sorted(first["copied"]) == expected and not first["kept"]
    assert not (workspace / "quizzes").exists()  # the bank is read from the package

    edit_cells(workspace / LESSON, lambda nb: add_paragraph(nb, "My note."))
    mine = (workspace / LESSON).read_bytes()
    (workspace / "notebooks" / "05_accumulation.ipynb").unlink()
    second = prepare(workspace)
    assert second["copied"] == ["notebooks/05_accumulation.ipynb"]
    assert (workspace / LESSON).read_bytes() == mine


def test_running_a_lesson_is_not_an_edit_and_edits_and_newer_versions_are_told_apart(course):
    shipped, workspace = course
    prepare(workspace)
    def ran(nb):  # what running it does: outputs, counts, kernel metadata
        code = next(c for c in nb["cells"] if c["cell_type"] == "code")
        code["outputs"], code["execution_count"] = [{"output_type": "stream", "name": "stdout", "text": "1\n"}], 1
        nb["metadata"]["language_info"] = {"name": "python", "version": "3.99"}
    edit_cells(workspace / "notebooks/01_data_parallelism.ipynb", ran)
    edit_cells(workspace / EXERCISE, lambda nb: add_paragraph(nb, "mine"))
    edit_cells(shipped / EXERCISE, add_paragraph)
    edit_cells(shipped / LESSON, add_paragraph)
    got = states(workspace)
    assert got["notebooks/01_data_parallelism.ipynb"] == "as shipped"
    assert got[EXERCISE] == "edited, and newer in the package"
    assert got[LESSON] == "newer in the package"
    assert prepare(workspace)["newer"] == [EXERCISE, LESSON]


def test_update_takes_the_newer_version_keeps_solutions_and_backs_up(course):
    shipped, workspace = course
    prepare(workspace)
    edit_cells(workspace / EXERCISE, lambda nb: [c.update(source="my code\n") for c in nb["cells"]
                                                 if "solution" in c["metadata"].get("tags", [])])
    before = (workspace / EXERCISE).read_bytes()
    assert replace(workspace, EXERCISE, only_if_newer=True)["replaced"] is False  # nothing newer yet
    assert (workspace / EXERCISE).read_bytes() == before

    edit_cells(shipped / EXERCISE, add_paragraph)
    done = replace(workspace, EXERCISE, only_if_newer=True)
    assert done["replaced"] and done["solutions_kept"] == 1
    assert (workspace / done["backup"]).read_bytes() == before
    assert solution_sources(workspace / EXERCISE) == ["my code\n"]
    assert "A new paragraph." in json.loads((workspace / EXERCISE).read_text())["cells"][0]["source"]
    assert states(workspace)[EXERCISE] == "edited"  # the solution is the learner's; nothing newer remains

    replace(workspace, EXERCISE, keep_solutions=False)
    assert solution_sources(workspace / EXERCISE) == solution_sources(shipped / EXERCISE)
    assert states(workspace)[EXERCISE] == "as shipped"


def test_solution_cells_pair_by_grade_id_then_id_then_order():
    def notebook(*cells):
        return {"cells": [{"cell_type": "code", "id": i, "source": s, "metadata": {"tags": ["solution"], **m}}
                          for i, s, m in cells]}
    old = notebook(("a", "mine A", {"nbgrader": {"grade_id": "g1"}}), ("b", "mine B", {}))
    new = notebook(("x", "stub B", {}), ("y", "stub A", {"nbgrader": {"grade_id": "g1"}}))
    merged, carried = carry_solutions(old, new)
    assert carried == 2 and [c["source"] for c in merged["cells"]] == ["mine B", "mine A"]
    with pytest.raises(ValueError, match="cannot be paired"):
        carry_solutions(notebook(("a", "1", {}), ("b", "2", {})), notebook(("a", "stub", {})))


def test_names_resolve_or_are_refused_with_the_choices(course):
    _, workspace = course
    prepare(workspace)
    assert resolve(workspace, "exercises/03") == EXERCISE
    assert resolve(workspace, "03_bucketing") == LESSON
    with pytest.raises(ValueError, match=r"NAME '03' matches 2 files .*03_buckets.*03_bucketing"):
        resolve(workspace, "03")
    with pytest.raises(ValueError, match="NAME 'nope' is not a course file"):
        resolve(workspace, "nope")


def test_the_workspace_command(course, capsys):
    shipped, workspace = course
    prepare(workspace)
    edit_cells(shipped / LESSON, add_paragraph)
    assert main(["workspace", "--workspace", str(workspace)]) == 0
    out = capsys.readouterr().out
    assert f"{LESSON}  " in out and "newer in the package" in out and "1 newer in the package" in out
    assert main(["workspace", "update", "--all", "--workspace", str(workspace)]) == 0
    assert "now the package's version" in capsys.readouterr().out
    assert states(workspace)[LESSON] == "as shipped"
    assert main(["workspace", "update", "--all", "--workspace", str(workspace)]) == 0
    assert "Nothing to update" in capsys.readouterr().out
    for argv, words in ((["workspace", "update"], "update needs a NAME"),
                        (["workspace", "status", "03"], "status takes no NAME"),
                        (["workspace", "update", "--blank", LESSON], "--blank belongs to restore"),
                        (["workspace", "--workspace", str(workspace / "nowhere")], "does not exist")):
        extra = [] if "--workspace" in argv else ["--workspace", str(workspace)]
        assert main(argv + extra) == 2
        assert words in capsys.readouterr().err


def test_a_bad_course_folder_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("DPTEACH_COURSE", str(tmp_path))
    with pytest.raises(ValueError, match="DPTEACH_COURSE=.* has no notebooks/ folder"):
        materials.course_root()


@pytest.mark.slow  # grades on real ranks
def test_grade_writes_gradescope_results_for_a_notebook_and_for_an_empty_submission(course, capsys):
    shipped, workspace = course
    exercise = get_exercise("03")
    prepare(workspace)
    notebook = workspace / EXERCISE
    edit_cells(notebook, lambda nb: [c.update(source=solution("03")) for c in nb["cells"]
                                     if "solution" in c["metadata"].get("tags", [])])
    out = workspace / "results" / "results.json"
    assert main(["grade", str(notebook), "--format", "gradescope", "--output", str(out), "--no-record"]) == 0
    results = json.loads(out.read_text())
    assert results["score"] == exercise.max_score == sum(t["max_score"] for t in results["tests"])
    assert len(results["tests"]) == len(exercise.checks)
    hidden = [t for t, c in zip(results["tests"], exercise.checks) if c.hidden]
    assert hidden and {t["visibility"] for t in hidden} == {HIDDEN_VISIBILITY}
    assert all(t["name"].count("hidden") == 1 for t in hidden), [t["name"] for t in hidden]

    empty = workspace / "submission"
    empty.mkdir()
    assert main(["grade", "--submission", str(empty), "--exercise", "03", "--format", "gradescope",
                 "--output", str(out)]) == 1
    assert json.loads(out.read_text())["score"] == 0
    assert main(["grade", "--submission", str(empty)]) == 2
    assert "--submission needs --exercise" in capsys.readouterr().err
    assert main(["grade", "03", "--json", "--format", "gradescope"]) == 2


def test_autograder_bundle_has_executable_scripts_at_the_zip_root(tmp_path, capsys):
    wheel = tmp_path / "dpteach-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"PK")  # only copied, never opened
    written = write_bundle("03", tmp_path / "bundle", wheel=wheel, torch="torch==2.13.0")
    with zipfile.ZipFile(written["zip"]) as zf:
        assert sorted(zf.namelist()) == sorted(["setup.sh", "run_autograder", wheel.name])
        for name in ("setup.sh", "run_autograder"):
            assert (zf.getinfo(name).external_attr >> 16) & 0o111
    setup = (tmp_path / "bundle" / "setup.sh").read_text()
    assert '"torch==2.13.0"' in setup and f'"./{wheel.name}"' in setup
    assert "--exercise 03" in (tmp_path / "bundle" / "run_autograder").read_text()
    assert main(["autograder", "03", "--out", str(tmp_path / "b2"), "--wheel", str(tmp_path / "missing.whl")]) == 2
    assert "is not a wheel file" in capsys.readouterr().err


def test_the_lab_opens_a_clone_itself_and_a_workspace_when_asked(course, monkeypatch, capsys):
    from dpteach.commands.lab import open_folder
    shipped, workspace = course
    assert open_folder(None) == shipped  # a course folder of its own ($DPTEACH_COURSE, or a clone): opened as is
    assert open_folder(str(workspace)) == workspace.resolve()
    assert "copied" in capsys.readouterr().out
    edit_cells(shipped / LESSON, add_paragraph)
    assert open_folder(str(workspace)) == workspace.resolve()
    out = capsys.readouterr().out
    assert "your files are kept as they are" in out and LESSON in out and "newer version" in out
    monkeypatch.delenv("DPTEACH_COURSE")
    assert open_folder(None) == ROOT


def test_workspace_init_copies_the_course_once_and_starts_no_server(course, monkeypatch, capsys, tmp_path):
    import subprocess

    from dpteach.workspace import STATE, fingerprint
    shipped, _ = course
    def no_server(*args, **kwargs):
        raise AssertionError(f"init started a process: {args}")
    monkeypatch.setattr(subprocess, "Popen", no_server)
    monkeypatch.setattr(subprocess, "call", no_server)
    files = materials.shipped_files(shipped, materials.WORKSPACE_FOLDERS)
    lessons = sum(rel.startswith("notebooks/") and rel.endswith(".ipynb") for rel in files)
    exercises = sum(rel.startswith("exercises/") and rel.endswith(".ipynb") for rel in files)
    folder = tmp_path / "hub home" / "dpteach-course"  # its parent does not exist either

    assert main(["workspace", "init", str(folder)]) == 0
    out = capsys.readouterr().out
    assert f"Workspace {folder.resolve()} (a new folder)" in out
    assert f"copied {lessons} lessons, {exercises} exercises" in out and "0 already there" in out
    assert "open notebooks/00_start_here.ipynb" in out and "file browser" in out
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_file() and ".dpteach" not in p.parts) == sorted(files)
    for rel, source in files.items():
        assert (folder / rel).read_text(encoding="utf-8") == source.read_text(encoding="utf-8"), rel
    state = json.loads((folder / STATE).read_text())
    assert {rel: entry["given"] for rel, entry in state["files"].items()} == \
        {rel: fingerprint(source) for rel, source in files.items()}

    edit_cells(folder / LESSON, lambda nb: add_paragraph(nb, "My note."))
    mine, record = (folder / LESSON).read_bytes(), (folder / STATE).read_bytes()
    assert main(["workspace", "init", "--workspace", str(folder)]) == 0
    out = capsys.readouterr().out
    assert f"nothing copied: all {len(files)} course files are already there" in out and "copied 1" not in out
    assert (folder / LESSON).read_bytes() == mine and (folder / STATE).read_bytes() == record

    assert main(["workspace", "--workspace", str(folder)]) == 0
    out = capsys.readouterr().out
    assert f"Workspace {folder.resolve()}" in out
    rows = dict(line.split(None, 1) for line in out.splitlines()[1:])
    assert rows[LESSON] == "edited" and set(rows) == set(files)
    assert [rel for rel, state in rows.items() if state != "as shipped"] == [LESSON]

    monkeypatch.setenv("DPTEACH_WORKSPACE", str(tmp_path / "default"))  # no DIR: the default workspace
    assert main(["workspace", "init"]) == 0
    assert f"Workspace {(tmp_path / 'default').resolve()} (a new folder)" in capsys.readouterr().out
    assert (tmp_path / "default" / LESSON).is_file()


def test_workspace_init_refuses_a_file_and_the_other_actions_point_to_it(course, capsys, tmp_path):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine\n")
    for argv, named in ((["workspace", "init", str(a_file)], f"DIR {str(a_file)!r} is a file, not a folder"),
                        (["workspace", "init", "--workspace", str(a_file / "sub")],
                         f"--workspace {str(a_file / 'sub')!r} is inside {str(a_file)!r}, a file")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert named in err and "give a new folder" in err, err
    assert a_file.read_text() == "mine\n"
    assert main(["workspace", "init", str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    assert "init takes one DIR, got 2" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert main(["workspace", "update", "--all", "--workspace", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "`dpteach workspace init DIR`" in err and "`dpteach lab`" in err


def test_the_workspace_the_learner_chose_is_the_one_later_commands_mean(course, monkeypatch, capsys, tmp_path):
    """``dpteach lab --workspace DIR`` (its preparation, without the server), then ``dpteach workspace`` alone."""
    from dpteach.commands.lab import open_folder
    monkeypatch.delenv("DPTEACH_WORKSPACE", raising=False)
    monkeypatch.setenv("DPTEACH_HOME", str(tmp_path / "home-state"))
    chosen = tmp_path / "elsewhere" / "my-course"
    assert open_folder(str(chosen)) == chosen.resolve()
    capsys.readouterr()
    edit_cells(chosen / LESSON, lambda nb: add_paragraph(nb))
    assert main(["workspace"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Workspace {chosen.resolve()} (the one you chose last")
    assert any(LESSON in line and "edited" in line for line in out.splitlines())
    # init chooses too; the environment's choice wins over both; a workspace that is gone is not offered
    other = tmp_path / "other"
    assert main(["workspace", "init", str(other)]) == 0
    capsys.readouterr()
    assert main(["workspace"]) == 0 and f"Workspace {other.resolve()} (the one you chose last" in capsys.readouterr().out
    monkeypatch.setenv("DPTEACH_WORKSPACE", str(chosen))
    assert main(["workspace"]) == 0 and f"Workspace {chosen.resolve()} ($DPTEACH_WORKSPACE)" in capsys.readouterr().out
    monkeypatch.delenv("DPTEACH_WORKSPACE")
    shutil.rmtree(other)
    from dpteach.workspace import default_workspace
    assert default_workspace() == Path.home() / "dpteach-course"
