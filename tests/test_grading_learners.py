"""The grader against learners it has never seen: correct code in unusual styles, new mistakes,
tampering with the libraries the checks use, and code that ends its own process."""
import pytest

from dpteach.grading import get_exercise, grade_sources
from learners.styles import SWAPS, solution


@pytest.mark.slow
@pytest.mark.parametrize("exercise", ["01", "02"])
def test_a_correct_ring_scores_full_marks_in_every_call_style(exercise):
    """``send`` is built on ``isend`` in this torch: a blocking-send ring must not be charged twice."""
    styles = sorted(SWAPS)
    reports = grade_sources(exercise, [(solution(exercise, style), None) for style in styles])
    for style, report in zip(styles, reports):
        lost = [(row.name, row.message) for row in report.checks if not row.passed]
        assert report.score == get_exercise(exercise).max_score, (style, lost)
