"""The grader against learners it has never seen: correct code in unusual styles, new mistakes,
tampering with the libraries the checks use, and code that ends its own process."""
import pytest

from dpteach.grading import get_exercise, grade_sources
from learners.exits import EXITS
from learners.exits import solution as exit_solution
from learners.quantized_gather import STYLES
from learners.styles import SWAPS, solution
from learners.tampering import CODE_SWAP, TAMPERING


@pytest.mark.slow
@pytest.mark.parametrize("exercise", ["01", "02"])
def test_a_correct_ring_scores_full_marks_in_every_call_style(exercise):
    """``send`` is built on ``isend`` in this torch: a blocking-send ring must not be charged twice."""
    styles = sorted(SWAPS)
    reports = grade_sources(exercise, [(solution(exercise, style), None) for style in styles])
    for style, report in zip(styles, reports):
        lost = [(row.name, row.message) for row in report.checks if not row.passed]
        assert report.score == get_exercise(exercise).max_score, (style, lost)


@pytest.mark.slow
def test_a_correct_quantised_all_gather_scores_full_marks_however_it_moves_its_bytes():
    """Exercise 11's ceiling on the bytes a rank receives leaves room for the headers of other collectives (a
    broadcast per rank, a ring of isend/irecv, the course's ring_all_gather and its lengths), not for float32."""
    names = sorted(STYLES)
    reports = grade_sources("11", [(STYLES[name], None) for name in names])
    for name, report in zip(names, reports):
        lost = [(row.name, row.message) for row in report.checks if not row.passed]
        assert report.score == get_exercise("11").max_score, (name, lost)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXITS))
def test_a_rank_that_ends_its_own_process_is_reported_as_that_within_seconds(name):
    """Not as "timed out: an endless loop, or a deadlock" after the whole time limit: the launcher sees the
    process end (exit code 0 without a result is a failure too) and the grader names the rank and check."""
    (report,) = grade_sources("02", [(exit_solution(name), [1])])  # W=2, the first check with a peer
    row = report.checks[1]
    # "error", not "timed_out": the end was seen when it happened, not inferred at the time limit
    assert row.outcome == "error" and EXITS[name][1] in row.message, row.message
    assert f"during the check '{get_exercise('02').checks[1].name}'" in row.message


@pytest.mark.slow
def test_rewiring_the_libraries_the_checks_use_scores_zero_and_says_so():
    names = sorted(TAMPERING)
    reports = grade_sources("02", [(TAMPERING[name][0], None) for name in names])
    for name, report in zip(names, reports):
        assert report.score == 0, (name, report.score)
        assert report.tampered and TAMPERING[name][1] in " ".join(report.tampered), (name, report.tampered)
        assert "SCORE 0: the checks could not be trusted" in report.text()
        assert any(row.outcome == "tampered" for row in report.checks)


@pytest.mark.slow  # more than 4 s on 2 cores: in `make test`, not `make test-fast`
def test_tampering_the_seal_misses_is_caught_by_the_replay_outside_the_ranks():
    """The helper that computes the expected sum keeps its identity but gets new code: the seal sees
    nothing, the rank's checks pass; the clean process that replays them does not, and says so."""
    report = grade_sources("02", [(CODE_SWAP, None)])[0]  # alone: rank processes are shared within a batch
    assert report.score == 0, report.text()
    assert report.tampered and all("judged again outside them" in text for text in report.tampered)
    swapped = [row for row in report.checks if row.outcome == "tampered"]
    assert swapped and all("judged again outside them" in row.message and "left waiting" not in row.message
                           for row in swapped), report.text()
    # the traffic checks failed in the rank already (nothing was sent): those stay plain failures
    assert [row.outcome for row in report.checks if "traffic" in row.name or "sends" in row.name] == ["failed"] * 2
