"""`dpteach quiz` and `dpteach progress`: validate, list, score an answers file, ask in a terminal."""
import json
import os
import subprocess
import sys

import pytest

from dpteach.cli import main
from dpteach.progress import ProgressStore
from dpteach.quiz import load_bank
from dpteach.quiz.scoring import option_order


@pytest.fixture
def progress_path(tmp_path, monkeypatch):
    path = tmp_path / "progress.json"
    monkeypatch.setenv("DPTEACH_PROGRESS", str(path))
    return path


@pytest.fixture
def bad_bank(tmp_path):
    folder = tmp_path / "bank"
    folder.mkdir()
    (folder / "memory.yaml").write_text(
        "topic: memory\nitems:\n  - id: memory-half-done\n    topic: memory\n    type: single\n"
        "    stem: What?\n    options: [{text: a, correct: true}]\n    trap: none\n"
        "    demonstrated_by: {notebook: 01_data_parallelism.ipynb, experiment: memory_per_replica}\n")
    return folder


def test_validate_passes_on_the_shipped_bank(capsys):
    assert main(["quiz", "--validate"]) == 0
    assert "all valid" in capsys.readouterr().out


def test_validate_fails_naming_file_and_item(bad_bank, capsys, monkeypatch):
    assert main(["quiz", "--validate", "--bank", str(bad_bank)]) == 1
    err = capsys.readouterr().err
    assert "memory.yaml: item 'memory-half-done': options[0]: 'explanation' is a required property" in err
    monkeypatch.setenv("DPTEACH_QUIZZES", str(bad_bank))
    assert main(["quiz", "--validate"]) == 1


def test_list_json(capsys):
    assert main(["quiz", "--list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == len(load_bank().items)
    assert all(set(row) == {"id", "topic", "type", "mirrors"} for row in rows)
    assert sum(row["mirrors"] is not None for row in rows) == 10
    assert main(["quiz", "--list", "--json", "--topic", "memory"]) == 0
    assert {row["topic"] for row in json.loads(capsys.readouterr().out)} == {"memory"}


def test_answers_file_json(tmp_path, capsys, progress_path):
    bank = load_bank()
    multiple = bank.get("sync-multi-gpu-essentials")
    answers = tmp_path / "answers.json"
    single = next(item for item in bank.topic("scaling") if item.type == "single")
    right = next(i for i, option in enumerate(single.options) if option.correct)  # an index in bank order
    wrong = next(o.text for o in bank.get("memory-zero-stage1").options if not o.correct)  # an option's text
    answers.write_text(json.dumps({single.id: [right], multiple.id: multiple.expected, "memory-zero-stage1": [wrong]}))
    assert main(["quiz", "--answers", str(answers), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["score"], result["max_score"]) == (2, 3)
    rows = {row["id"]: row for row in result["items"]}
    assert set(rows["memory-zero-stage1"]) == {"id", "correct", "chosen", "expected"}
    assert rows["memory-zero-stage1"]["correct"] is False
    assert rows["memory-zero-stage1"]["expected"] == bank.get("memory-zero-stage1").expected
    assert rows[multiple.id] == {"id": multiple.id, "correct": True, "chosen": multiple.expected,
                                 "expected": multiple.expected}
    assert not progress_path.exists()  # scripted answers are not a learner's attempt


@pytest.mark.parametrize("argv, message", [
    (["--topic", "nope"], "--topic 'nope' is not a course topic; choose one of: data_parallelism"),
    (["--exam", "0"], "--exam 0 must be at least 1"),
    (["--exam", "9999"], "--exam 9999: the bank holds"),
    (["--topic", "memory", "--exam", "3"], "choose one"),
    (["--json"], "--json applies only to --list and --answers"),
    (["--bank", "/no/such/folder", "--validate"], "--bank '/no/such/folder' is not a folder"),
    (["--answers", "/no/such/file.json"], "--answers '/no/such/file.json': no such file"),
])
def test_bad_arguments_exit_2_with_a_reason(argv, message, capsys, progress_path):
    assert main(["quiz", *argv]) == 2
    assert message in capsys.readouterr().err


def test_answers_file_that_is_not_json(tmp_path, capsys):
    bad = tmp_path / "a.json"
    bad.write_text("{nope")
    assert main(["quiz", "--answers", str(bad)]) == 2
    assert "is not valid JSON" in capsys.readouterr().err


def test_progress_command(progress_path, capsys):
    ProgressStore().record_quiz("memory-zero-stage1", "memory", True, ["x"])
    ProgressStore().record_exercise("ring_allreduce", 8, 10, "failed")
    assert main(["progress", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["quiz"]["memory"] == {"answered": 1, "correct": 1, "attempts": 1}
    assert summary["exercises"]["ring_allreduce"]["best"] == 8
    assert main(["progress"]) == 0
    out = capsys.readouterr().out
    assert "memory" in out and f"1 of {len(load_bank().topic('memory'))} answered" in out and "ring_allreduce" in out


@pytest.mark.slow  # more than 4 s on 2 cores: in `make test`, not `make test-fast`
def test_terminal_quiz_in_a_subprocess(tmp_path):
    """Typed answers through a pipe: a refused count, a typo, right, wrong, right, then end of input."""
    items = load_bank().topic("sync_async")
    assert items[0].type == "multiple"

    def numbers(item, right):
        order = option_order(item, 3)
        wanted = [i for i, option in enumerate(item.options) if option.correct == right]
        return ",".join(str(order.index(i) + 1) for i in wanted[: item.select])

    typed = ["1", "x", numbers(items[0], True), numbers(items[1], False), numbers(items[2], True)]
    progress = tmp_path / "progress.json"
    done = subprocess.run([sys.executable, "-m", "dpteach.cli", "quiz", "--topic", "sync_async", "--seed", "3"],
                          input="\n".join(typed) + "\n", capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DPTEACH_PROGRESS": str(progress)})
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "Pick exactly 3 options (you picked 1)." in out
    assert "'x' is not an option number; use 1..5" in out
    assert out.count("Common trap:") == 3 and items[1].options[0].explanation[:40] in out
    assert f"Score: 2 / {len(items)} (3 of {len(items)} answered)" in out
    recorded = ProgressStore(progress).load()["quiz"]
    assert {key: entry["last_correct"] for key, entry in recorded.items()} == \
        {items[0].id: True, items[1].id: False, items[2].id: True}
