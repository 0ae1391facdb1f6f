"""Exercise 04 judged on what matters, whatever the call style: correct hooks score full marks every time,
and a hook that launches buckets as soon as they are complete - out of bucket order - does not.

The solutions are in ``tests/learners/overlap.py``; none of them is a reference answer or a known-wrong
variant of one (``tests/answers``).
"""
import pytest
import torch

from dpteach.grading import get_exercise, grade_sources
from dpteach.grading.checks import ex04_steps, ex04_overlap
from learners.overlap import EAGER, NO_WAIT, STYLES, solution, style

EX04 = get_exercise("04")
ORDER_CHECKS = [i for i, c in enumerate(EX04.checks) if "out of order" in c.name or "different order" in c.name]
WAITED = next(i for i, c in enumerate(EX04.checks) if "waits for every all-reduce" in c.name)
# Every correct style and every wrong hook, graded once each in one launch (starting ranks is what grading spends
# its time on). How often the grader misjudges an honest hook is measured apart, by grading each style many
# times: benchmarks/grader_reliability.py.
WRONG = ("eager", "no wait", "blocking")


@pytest.fixture(scope="module")
def graded():
    blocking = solution("dist.all_reduce(buffer) or buffer", "pass", "view / world")  # async_op=False
    names = sorted(STYLES)
    sources = [style(name) for name in names] + [EAGER, NO_WAIT, blocking]
    return dict(zip(names + list(WRONG), grade_sources("04", [(source, None) for source in sources])))


@pytest.fixture(scope="module")
def wrong(graded):
    return {name: graded[name] for name in WRONG}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(STYLES))
def test_a_correct_overlap_hook_scores_full_marks_in_every_style(graded, name):
    """Work handles, futures waited on, chained with .then() (whose callback may run at once, inside
    backward, and wait on a future already done), collected, polled; averaged by dividing or by AVG."""
    report = graded[name]
    lost = [(row.name, row.message) for row in report.checks if not row.passed]
    assert report.score == EX04.max_score, (name, lost)


@pytest.mark.slow
def test_launching_each_bucket_as_soon_as_it_is_complete_fails_the_out_of_order_checks_and_only_those(wrong):
    report = wrong["eager"]
    failing = [i for i, row in enumerate(report.checks) if not row.passed]
    assert failing == ORDER_CHECKS, report.text()
    for i in ORDER_CHECKS:
        row = report.checks[i]
        assert row.outcome == "failed", report.text()  # a verdict, not a hang or a gloo crash
        assert row.message.startswith("rank 0: bucket 1 was launched after bucket 2"), row.message
        assert "matches collectives by the order of their launch" in row.message
        assert row.hint == ex04_overlap.HINT_ORDER


@pytest.mark.slow
def test_a_finish_that_never_waits_fails_the_waiting_check_with_its_reason(wrong):
    row = wrong["no wait"].checks[WAITED]
    assert row.outcome == "failed" and "finish() returned while an all-reduce was still running" in row.message


@pytest.mark.slow
def test_a_blocking_all_reduce_in_the_hook_still_loses_the_overlap_checks(wrong):
    """Averaging right is not overlapping: async_op=False blocks backward, as the exercise says."""
    report = wrong["blocking"]
    by_name = {row.name: row for row in report.checks}
    assert not by_name["W=2: one async all-reduce per bucket, launched in bucket order"].passed
    assert not by_name["W=2: every all-reduce starts during backward (overlap), not in finish()"].passed
    assert by_name["W=2: after finish(), every .grad is the average over ranks"].passed
    assert by_name["W=2: finish() waits for every all-reduce"].passed


@pytest.mark.parametrize("rank, first", [(0, 2), (1, 1), (2, 2), (3, 1)])
def test_the_twin_branch_model_completes_its_buckets_out_of_order_on_even_ranks_only(rank, first):
    """The premise of the order checks: on even ranks bucket 2 is complete before bucket 1."""
    widths, plan = ex04_overlap.TWIN, ex04_overlap.TWIN_PLAN
    model = ex04_steps._model(widths, torch.float32, seed=60)
    params = list(model.parameters())
    missing, completed = [len(bucket) for bucket in plan], []
    where = {params[i]: b for b, bucket in enumerate(plan) for i in bucket}

    def hook(param):
        missing[where[param]] -= 1
        if missing[where[param]] == 0:
            completed.append(where[param])

    for p in params:
        p.register_post_accumulate_grad_hook(hook)
    ex04_steps._loss(model, widths, torch.float32, 60, 0, rank).backward()
    assert completed[0] == 0 and completed[1] == first and sorted(completed) == [0, 1, 2]
    equal = [sum(params[i].numel() for i in plan[b]) for b in (1, 2)]
    assert equal[0] == equal[1]  # same size: ranks that disagree add up wrong numbers, gloo does not abort
