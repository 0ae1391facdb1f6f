"""Every reference solution scores full marks, graded exactly as a learner's notebook is.

Each test fills the reference solution into a copy of the exercise notebook (the cell tagged
``solution``) and runs ``dpteach grade --json`` through the CLI entry point: real ranks, every check,
visible and hidden. It also checks the JSON report's schema, the progress store, and ``dpteach progress``.
The grading time of each exercise is printed (run with ``-s`` to see it); a timing assertion would
fail on a busy machine for no fault of the grader, so the budget (15 s per exercise on 2 cores) is
measured by ``benchmarks/speed.py``, not asserted here.
"""
import json
import time
from pathlib import Path

import pytest

from dpteach.cli import main
from dpteach.grading import all_exercises
from answers.solutions import solution

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def own_progress_file(tmp_path, monkeypatch):
    """Each test its own progress store (the session-wide throwaway file is shared between tests)."""
    monkeypatch.setenv("DPTEACH_PROGRESS", str(tmp_path / "progress.json"))
CHECK_KEYS = {"name", "passed", "points", "earned", "hidden", "outcome", "message", "hint"}
OUTCOMES = {"passed", "failed", "error", "timed_out", "not_run", "forbidden", "grader_error"}


def notebook_with(tmp_path, exercise, code: str) -> Path:
    notebook = json.loads((ROOT / "exercises" / exercise.notebook_name).read_text())
    for cell in notebook["cells"]:
        if "solution" in cell["metadata"].get("tags", []):
            cell["source"] = code
    path = tmp_path / exercise.notebook_name
    path.write_text(json.dumps(notebook))
    return path


def check_schema(report: dict) -> None:
    assert {"exercise", "status", "score", "max_score", "checks"} <= set(report)
    assert report["status"] in {"passed", "failed", "not_attempted", "error"}
    assert isinstance(report["score"], int) and 0 <= report["score"] <= report["max_score"]
    for check in report["checks"]:
        assert set(check) == CHECK_KEYS
        assert isinstance(check["passed"], bool) and isinstance(check["hidden"], bool)
        assert isinstance(check["points"], int) and isinstance(check["message"], str)
        assert check["outcome"] in OUTCOMES
    assert report["visible"]["max_score"] + report["hidden"]["max_score"] == report["max_score"]


@pytest.mark.slow
@pytest.mark.parametrize("exercise", all_exercises(), ids=lambda e: e.stem)
def test_reference_solution_scores_full_marks_through_the_cli(exercise, tmp_path, capsys):
    path = notebook_with(tmp_path, exercise, solution(exercise.id))
    started = time.perf_counter()
    status = main(["grade", str(path), "--json"])
    elapsed = time.perf_counter() - started
    report = json.loads(capsys.readouterr().out)
    check_schema(report)
    failing = [(c["name"], c["message"]) for c in report["checks"] if not c["passed"]]
    assert failing == [] and report["forbidden"] == []
    assert (status, report["status"], report["score"]) == (0, "passed", exercise.max_score)
    assert report["hidden"]["max_score"] > 0 and all(c["earned"] == c["points"] for c in report["checks"])
    with capsys.disabled():
        print(f"\n    grading {exercise.stem}: {elapsed:.1f} s (grader's own clock {report['elapsed_s']:.1f} s)")

    assert main(["progress", "--json"]) == 0
    progress = json.loads(capsys.readouterr().out)
    assert progress["exercises"][exercise.stem] == {"best": exercise.max_score, "max": exercise.max_score,
                                                   "attempts": 1, "status": "passed"}
    assert main(["progress"]) == 0
    (line,) = [text for text in capsys.readouterr().out.splitlines() if exercise.stem in text]
    assert f"best {exercise.max_score:g} / {exercise.max_score:g}" in line and "(1 attempts, last: passed)" in line


def _reference_overlap_with_an_idle_layer():
    import torch
    import torch.distributed as dist
    from torch import nn
    namespace = {}
    exec(solution("04"), namespace)  # the answer key the exercise's hints describe
    torch.manual_seed(0)
    model = nn.ModuleDict({"used": nn.Linear(3, 2), "idle": nn.Linear(2, 2)})
    p = list(model.parameters())
    sync = namespace["OverlapSync"](model, [[p[3], p[2], p[1]], [p[0]]])  # the idle bias shares bucket 0
    torch.manual_seed(1 + dist.get_rank())
    model["used"](torch.randn(4, 3)).sum().backward()
    sync.finish()
    return [t.grad.tolist() for t in p]


def test_the_reference_overlap_hook_handles_a_parameter_without_gradient():
    """Exercise 04's introduction tells learners what to do when a parameter gets no gradient; the
    answer key must do it: zeros for the idle layer, a true average for the others, no hang."""
    import dpteach
    ranks = dpteach.launch(_reference_overlap_with_an_idle_layer, 2, backend="gloo", device="cpu", timeout=60)
    assert ranks[0] == ranks[1]
    assert ranks[0][2] == [[0.0, 0.0], [0.0, 0.0]] and ranks[0][3] == [0.0, 0.0]
    assert any(v != 0 for v in ranks[0][1])
