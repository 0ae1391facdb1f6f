"""A check that fails on one rank while its peers still wait for it, inside the learner's code, is reported as
that failure - on that rank, with its message - not as a deadlock, and the later checks still run.

The learners (``tests/learners``): exercise 09 with a padded ring whose kept slice is one element off
``chunk_bounds`` on some ranks (they fail the slice checks; the others go on to step() and wait in the
all-gather), and exercise 04 dividing by ``get_rank() + 1`` (right on one rank of two: the other fails
at step 1 while its peer waits in step 2's all-reduce).
"""
import pytest

from dpteach.grading import get_exercise, grade_sources
from dpteach.grading.in_rank import WATCHDOG_EXIT_CODE
from dpteach.grading.report import CheckResult
from dpteach.grading.runner import blame
from dpteach.ranks.launcher import RankError
from learners.overlap import RANK_FOR_WORLD
from learners.zero2 import PADDED
from test_grading_failures import live_ranks_started_by_us

EX04, EX09 = get_exercise("04"), get_exercise("09")


def index(exercise, piece):
    return next(i for i, check in enumerate(exercise.checks) if piece in check.name)


@pytest.mark.slow
def test_a_padded_ring_one_element_off_fails_its_slice_checks_by_rank_and_every_other_check_runs():
    (report,) = grade_sources("09", [(PADDED, None)])
    rows = report.checks
    assert not any(row.outcome in ("timed_out", "not_run") for row in rows), report.text()
    grad = rows[index(EX09, "grad_slice() is this rank's slice")]
    assert grad.outcome == "failed", report.text()
    assert grad.message.startswith("rank 1: grad_slice() holds 26 elements, but this rank's slice "
                                   "chunk_bounds(N, W)[rank] has 25"), grad.message
    assert "the other ranks were left waiting for rank 1 and were stopped" in grad.message
    uneven = rows[index(EX09, "W=3: N not divisible by W")]
    assert uneven.outcome == "failed" and uneven.message.startswith("rank 2: grad_slice() holds 11 elements")
    # the padding is cut off again: the weights are right, and the checks after the failures said so
    assert rows[index(EX09, "three steps equal SGD")].passed and rows[index(EX09, "a world of one rank")].passed
    assert live_ranks_started_by_us() == []


@pytest.mark.slow
def test_a_failure_on_one_rank_is_reported_with_its_message_while_its_peer_waits_in_the_next_step():
    steps, twin = index(EX04, "three steps in a row"), index(EX04, "complete out of order on one rank")
    (report,) = grade_sources("04", [(RANK_FOR_WORLD, [steps, twin])])
    for i, later in ((steps, "(step 1 of 3)"), (twin, "(step 1 of 2)")):
        row = report.checks[i]
        assert row.outcome == "failed", report.text()
        assert row.message.startswith(f"rank 0: the gradients are the sum over ranks, not the average: divide "
                                      f"by W {later}"), row.message
        assert "left waiting for rank 0 and were stopped" in row.message
    # the peer was stopped once rank 0 had failed, not at the time limit: two checks, two worlds, seconds
    assert report.elapsed_s < EX04.checks[steps].limit + EX04.checks[twin].limit + 20, report.elapsed_s
    assert live_ranks_started_by_us() == []


def _blamed(per_rank, timeout, failure):
    row = CheckResult(name="W=2", points=2, hidden=False, hint="the check's hint")
    how = blame(row, EX09.checks[1], per_rank, timeout, failure, 1.0)
    return row, how


def test_a_verdict_written_before_the_world_died_is_the_blame_and_later_checks_are_not_skipped():
    stopped = {"event": "stopped", "rank": 0, "at": 101.0}
    died = RankError(0, f"exited with code {WATCHDOG_EXIT_CODE}", exit_code=WATCHDOG_EXIT_CODE)
    failed = {"rank": 1, "outcome": "failed", "at": 100.0, "message": "grad_slice() holds 26 elements",
              "hint": "its own hint"}
    row, how = _blamed({1: failed}, stopped, died)
    assert (row.outcome, how, row.hint) == ("failed", None, "its own hint")
    assert row.message == ("rank 1: grad_slice() holds 26 elements\n(the other ranks were left waiting for "
                           "rank 1 and were stopped)")
    # the first failure speaks, on whichever rank; what zeroes the exercise speaks before it
    later = {"rank": 2, "outcome": "failed", "at": 100.5, "message": "a later failure"}
    assert _blamed({2: later, 1: failed}, stopped, died)[0].message.startswith("rank 1: grad_slice()")
    tampered = dict(later, outcome="tampered", message="your code replaced torch.equal")
    assert _blamed({2: tampered, 1: failed}, stopped, died)[0].outcome == "tampered"
    # a failure written after a watchdog fired at the limit is an echo of the hang: the hang is reported
    row, how = _blamed({1: dict(failed, at=102.0)}, {"event": "timeout", "rank": 0, "at": 101.0}, died)
    assert (row.outcome, how) == ("timed_out", "did not finish (timed out)")
