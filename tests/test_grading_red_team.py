"""The red team's held-out tampering solutions (``tests/learners/red_team.py``) score no more than doing
nothing, the report names the tampering where the grader can tell, and a submission graded after a
tampering one in the same batch is judged in a process of its own.

Each case is graded alone (``grade_source``: a launch of its own), as a learner's code would be.
"""
import pytest

from dpteach.grading import get_exercise, grade_source, grade_sources
from learners.red_team import CASES, HONEST_POINTS
from answers.solutions import solution

# What the report must say, per case: the outcome of a check that names it, and words in its message.
NAMED = {
    "H1 salts made predictable by patching random._urandom (02)": ("tampered", "random._urandom"),
    "H2 the grader's all-gather faked at class level (02)": ("tampered", "ProcessGroup.allgather"),
    "H3 the seed read from the check's frame through ctypes (02)": ("error", "imports ctypes"),
    "H2 the grader's all-gather faked, with a cache across calls (01)": ("tampered", "ProcessGroup.allgather"),
    "H4 the DDP hook's closure counter reset (05)": ("tampered", "looked inside _averaging_hook"),
    "H5 gradients through files, junk messages for the byte count (08)": ("timed_out", "timed out"),
    "H6 state_numel() reports a slice, the state is whole (08)": ("failed", "in tensors of its own"),
    "H5 a gather to rank 0 sent past the counter with ProcessGroup.send (02)": ("failed", "sent more elements"),
    "H3+H5 files, and the traffic count switched off through ctypes (08)": ("error", "imports ctypes"),
    "H4+H5 files, ctx from compute_gradient's closure, traffic count off (07)": ("error", "imports ctypes"),
    "H3 the overlap drive's state flipped through ctypes (04)": ("error", "imports ctypes"),
    "H7 float32 all-gathered, int8 claimed (11)": ("failed", "bytes reached this rank"),
    "H8 the scales never sent, own scales used (11)": ("failed", "decoded with the scales of the rank that sent it"),
    "H8 the scales never sent, scale 1 used (11)": ("failed", "more than half a step"),
    "H9 one scale for the whole tensor, repeated per block (11)": ("failed", "one scale for the whole tensor"),
}


def _said(report, outcome, words) -> bool:
    if outcome == "error":  # the cells could not even be loaded: the static reading names it
        return report.status == "error" and any(words in text for text in report.tampered)
    rows = [row for row in report.checks if row.outcome == outcome]
    return any(words in row.message for row in rows)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_red_team_solution_scores_no_more_than_doing_nothing(name):
    exercise, source = CASES[name]
    untouched = grade_source(exercise, get_exercise(exercise).stub, record=False)
    report = grade_source(exercise, source, record=False)
    assert untouched.status == "not_attempted" and untouched.score == 0
    assert report.score <= untouched.score + HONEST_POINTS.get(name, 0), report.text()
    assert _said(report, *NAMED[name]), report.text()
    if NAMED[name][0] == "tampered":
        assert "SCORE 0" in report.text()


def test_every_red_team_case_is_named_in_the_test():
    assert set(NAMED) == set(CASES)


@pytest.mark.slow
def test_an_honest_solution_after_a_tampering_one_in_the_same_batch_still_scores_full_marks():
    honest = solution("02")
    fake = CASES["H2 the grader's all-gather faked at class level (02)"][1]
    reload_ = ("import importlib, sys, types\nimport torch\n"
               "name = 'dpteach.grading.checks.ex02_ring_all_reduce'\n"
               "sys.modules[name] = types.ModuleType(name)\n"
               "importlib.reload(importlib.import_module('dpteach.grading.checks.common'))\n\n"
               "def ring_all_reduce(tensor):\n    return tensor\n")
    reports = grade_sources("02", [(honest, None), (fake, None), (honest, None), (reload_, None), (honest, None)])
    scores = [report.score for report in reports]
    full = get_exercise("02").max_score
    assert scores[0] == scores[2] == scores[4] == full, [r.text() for r in reports]
    assert scores[1] == 0 and scores[3] <= 1
