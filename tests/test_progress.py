"""The progress store: round trip, atomic writes, corrupt files set aside, two writers lose nothing."""
import json
import multiprocessing

import pytest

import dpteach
from dpteach.progress import ProgressFileWarning, ProgressStore, default_progress_path


@pytest.fixture
def path(tmp_path, monkeypatch):
    path = tmp_path / "learner" / "progress.json"
    monkeypatch.setenv("DPTEACH_PROGRESS", str(path))
    return path


def test_location_comes_from_the_environment(path, monkeypatch):
    assert default_progress_path() == path and ProgressStore().path == path
    monkeypatch.delenv("DPTEACH_PROGRESS")
    assert default_progress_path().parts[-2:] == (".dpteach", "progress.json")


def test_quiz_and_exercise_round_trip(path):
    store = ProgressStore()
    store.record_quiz("scaling-amdahl", "scaling", False, ["64x"])
    entry = store.record_quiz("scaling-amdahl", "scaling", True, ["About 15x: 1 / (0.05 + 0.95 / 64)"])
    assert entry["attempts"] == 2 and entry["ever_correct"] and entry["last_correct"]
    store.record_quiz("memory-zero-stage1", "memory", False, ["About 16 GB"])
    store.record_exercise("ring_allreduce", 3, 10, "failed")
    store.record_exercise("ring_allreduce", 10, 10, "passed")
    store.record_exercise("ring_allreduce", 7, 10, "failed")

    data = ProgressStore(path).load()
    quiz = data["quiz"]["scaling-amdahl"]
    assert quiz["last_chosen"] == ["About 15x: 1 / (0.05 + 0.95 / 64)"]
    assert quiz["first_answered"] <= quiz["last_answered"]
    exercise = data["exercises"]["ring_allreduce"]
    assert (exercise["best_score"], exercise["last_score"], exercise["attempts"], exercise["last_status"]) == \
        (10, 7, 3, "failed")
    assert exercise["first_attempt"] <= exercise["last_attempt"]
    assert json.loads(path.read_text()) == data

    assert store.summary() == {
        "quiz": {"memory": {"answered": 1, "correct": 0, "attempts": 1},
                 "scaling": {"answered": 1, "correct": 1, "attempts": 2}},
        "exercises": {"ring_allreduce": {"best": 10, "max": 10, "attempts": 3, "status": "failed"}},
        "predictions": {},
    }


def test_predictions_keep_the_last_and_the_best_relative_error(path):
    store = ProgressStore()
    first = store.record_prediction("02-ring-largest", "02", 12.0, 10.0, "ms")
    assert first["last_error"] == pytest.approx(0.2) and first["attempts"] == 1
    second = store.record_prediction("02-ring-largest", "02", 9.5, 10.0, "ms")
    assert second["last_error"] == pytest.approx(-0.05) and second["best_error"] == pytest.approx(-0.05)
    third = store.record_prediction("02-ring-largest", "02", 20.0, 10.0, "ms")
    assert third["best_error"] == pytest.approx(-0.05) and third["attempts"] == 3
    assert store.summary()["predictions"]["02-ring-largest"]["last_error"] == pytest.approx(1.0)
    for bad, message in (({"predicted": "12"}, "predicted="), ({"measured": float("nan")}, "measured="),
                         ({"measured": 0.0}, "measured=0 is not allowed"), ({"key": ""}, "key=")):
        arguments = {"key": "k", "lesson": "02", "predicted": 1.0, "measured": 2.0, "unit": "ms", **bad}
        with pytest.raises(ValueError, match=message):
            store.record_prediction(**arguments)


def test_empty_store(path):
    assert ProgressStore().load() == {"version": 1, "quiz": {}, "exercises": {}, "predictions": {}}
    assert ProgressStore().summary() == {"quiz": {}, "exercises": {}, "predictions": {}}


def test_writes_leave_no_temporary_files(path, monkeypatch):
    store = ProgressStore()
    for n in range(5):
        store.record_quiz(f"item-{n}", "memory", True, ["x"])
    assert sorted(p.name for p in path.parent.iterdir()) == ["progress.json", "progress.json.lock"]

    before = path.read_text()

    def crash(*args, **kwargs):
        raise OSError("disk full")
    monkeypatch.setattr("dpteach.progress.os.fsync", crash)  # the disk fails after the temporary is written
    with pytest.raises(OSError, match="disk full"):
        store.record_quiz("item-9", "memory", True, ["x"])
    assert path.read_text() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["progress.json", "progress.json.lock"]


@pytest.mark.parametrize("content", ['{"quiz": {"half', "[1, 2]", '{"quiz": []}'])
def test_corrupt_file_is_set_aside_and_reported(path, content):
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with pytest.warns(ProgressFileWarning) as caught:
        ProgressStore().record_quiz("scaling-amdahl", "scaling", True, ["x"])
    [moved] = list(path.parent.glob("progress.json.corrupt-*"))
    assert moved.read_text() == content
    message = str(caught[0].message)
    assert str(path) in message and str(moved) in message
    assert list(ProgressStore().load()["quiz"]) == ["scaling-amdahl"]


@pytest.mark.parametrize("call, message", [
    (lambda s: s.record_quiz("", "memory", True, []), "item_id"),
    (lambda s: s.record_quiz("a", "memory", 1, []), "correct must be True or False"),
    (lambda s: s.record_quiz("a", "memory", True, "text"), "chosen must be a list"),
    (lambda s: s.record_exercise("ring", 11, 10, "passed"), "score must be a number between 0 and max_score=10"),
    (lambda s: s.record_exercise("ring", 1, 0, "passed"), "max_score must be a positive number"),
    (lambda s: s.record_exercise("ring", 1, 10, ""), "status"),
])
def test_bad_arguments_are_refused(path, call, message):
    with pytest.raises(ValueError, match=message):
        call(ProgressStore())
    assert not path.exists()


def _record_twenty(path, name):
    store = ProgressStore(path)
    for n in range(20):
        store.record_quiz(f"{name}-{n}", "overlap", n % 2 == 0, [str(n)])
        store.record_quiz("shared", "overlap", True, [name])


def test_two_writer_processes_lose_nothing(path):
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(method)
    writers = [context.Process(target=_record_twenty, args=(path, name)) for name in ("a", "b")]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(60)
        assert writer.exitcode == 0
    quiz = ProgressStore(path).load()["quiz"]
    assert len(quiz) == 41 and quiz["shared"]["attempts"] == 40
    assert ProgressStore(path).summary()["quiz"]["overlap"] == {"answered": 41, "correct": 21, "attempts": 80}


def test_progress_lives_with_the_workspace_it_was_earned_in(tmp_path, monkeypatch):
    monkeypatch.delenv("DPTEACH_PROGRESS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    first, second = tmp_path / "ana", tmp_path / "ben"
    for workspace in (first, second):
        (workspace / ".dpteach").mkdir(parents=True)
        (workspace / ".dpteach" / "workspace.json").write_text("{}")
        (workspace / "notebooks").mkdir()
    monkeypatch.chdir(first / "notebooks")  # where a lesson's kernel runs
    ProgressStore().record_exercise("01_ring", 3, 5, "failed")
    monkeypatch.chdir(second)
    assert default_progress_path() == second / ".dpteach" / "progress.json"
    assert ProgressStore().load()["exercises"] == {}  # another learner's workspace: its own record
    monkeypatch.chdir(tmp_path)
    assert default_progress_path() == tmp_path / "home" / ".dpteach" / "progress.json"
    assert ProgressStore(default_progress_path(first)).load()["exercises"]["01_ring"]["best_score"] == 3


@pytest.mark.slow
def test_grading_someone_elses_submission_leaves_the_graders_progress_alone(tmp_path, monkeypatch):
    """`dpteach grade --submission` (instructors, autograders) records nothing; `dpteach grade PATH` does."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path
    exercise = sorted((Path(__file__).resolve().parents[1] / "exercises").glob("01_*.ipynb"))[0]
    notebook = json.loads(exercise.read_text())
    for cell in notebook["cells"]:
        if "solution" in cell.get("metadata", {}).get("tags", []):
            cell["source"] = "def reduce_scatter(:\n"  # attempted, and broken: graded in no time, no ranks
    submission = tmp_path / "submission"
    submission.mkdir()
    (submission / exercise.name).write_text(json.dumps(notebook))
    progress = tmp_path / "progress.json"
    env = {**__import__("os").environ, "DPTEACH_PROGRESS": str(progress)}
    run = [sys.executable, "-m", "dpteach", "grade"]
    graded = subprocess.run(run + ["--submission", str(submission), "--exercise", "01"], env=env,
                            capture_output=True, text=True, timeout=300)
    assert graded.returncode == 1 and "error" in graded.stdout.lower(), graded.stdout + graded.stderr
    assert not progress.exists()
    mine = tmp_path / "mine.ipynb"
    shutil.copy(submission / exercise.name, mine)
    subprocess.run(run + [str(mine), "--exercise", "01"], env=env, capture_output=True, text=True, timeout=300)
    assert ProgressStore(progress).load()["exercises"]  # one's own notebook is one's own attempt
