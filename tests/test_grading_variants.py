"""Every known-wrong variant loses points, on the check written to catch it, with a message that says why.

The variants (``tests/answers/wrong_variants.py``) are the reference solutions with one realistic
mistake each: an off-by-one chunk index, a missing division by W, a sync decided after forward, a hook
that reduces the parameter instead of its gradient, a stale bucket, and more. Each is graded on real
ranks on the checks meant to catch it (``only=``); the variants of one exercise share their worlds
(``grade_sources``), because starting ranks is what grading spends most of its time on.
"""
import pytest

from dpteach.grading import get_exercise, grade_sources
from answers.solutions import solution
from answers.wrong_variants import VARIANTS

EXERCISES = sorted({v.exercise for v in VARIANTS})


@pytest.mark.slow
@pytest.mark.parametrize("exercise", EXERCISES)
def test_known_wrong_variants_fail_the_checks_meant_for_them(exercise):
    variants = [v for v in VARIANTS if v.exercise == exercise]
    for variant in variants:
        assert variant.source() != solution(exercise)
    reports = grade_sources(exercise, [(v.source(), v.failing_checks()) for v in variants])
    for variant, report in zip(variants, reports):
        rows = [report.checks[i] for i in variant.failing_checks()]
        assert all(not row.passed for row in rows), (variant.name, [(row.name, row.outcome) for row in rows])
        assert variant.message in rows[0].message, (variant.name, rows[0].message)
        assert report.status == "failed" and report.score < get_exercise(exercise).max_score, variant.name
        for row in rows:
            assert row.outcome in ("failed", "error", "timed_out"), (variant.name, row.outcome)
            assert "tensor(" not in row.message  # messages describe; they never print expected values


def test_the_mistakes_the_issue_names_are_all_covered():
    names = " | ".join(v.name for v in VARIANTS)
    for mistake in ("off-by-one chunk index", "missing division by W", "sync decided after forward",
                    "reduces the parameter instead of its gradient", "stale bucket"):
        assert mistake in names
