"""The grader's hints point at the failure they explain, and a skipped check names the one that broke."""
import pytest

from dpteach.grading import get_exercise, grade_sources
from dpteach.grading.checks import ex02_ring_all_reduce as ex02
from learners.hints import HANGS_ON_THREE, NO_COPY_BACK, OFF_BY_ONE, ONE_STEP_SHORT, SHIFTED

pytestmark = pytest.mark.slow  # five submissions graded on real ranks (12 s on 2 cores)


@pytest.fixture(scope="module")
def reports():
    sources = {"off by one": OFF_BY_ONE, "one step short": ONE_STEP_SHORT, "no copy back": NO_COPY_BACK,
               "shifted": SHIFTED, "hangs on three": HANGS_ON_THREE}
    names = list(sources)
    graded = grade_sources("02", [(sources[name], None) for name in names])
    return dict(zip(names, graded))


def failing(report):
    return [row for row in report.checks if row.outcome != "passed"]


def test_an_off_by_one_chunk_index_gets_a_hint_about_the_passes_not_about_copying_back(reports):
    rows = [row for row in failing(reports["off by one"]) if "W=1" not in row.name]
    assert rows, reports["off by one"].text()
    assert all(row.hint in (ex02.HINT_VALUES, ex02.HINT_CHUNKS) for row in rows), reports["off by one"].text()


def test_a_pass_that_stops_a_step_short_gets_the_chunks_named_and_the_chunk_hint(reports):
    rows = [row for row in failing(reports["one step short"]) if "chunk" in row.message]
    assert rows, reports["one step short"].text()
    for row in rows:
        assert row.hint == ex02.HINT_CHUNKS and "on this rank, chunk" in row.message, row
        assert "differ from the sum; the other chunks hold it" in row.message


def test_the_copy_back_hint_comes_only_when_the_sum_was_returned_and_the_input_did_not_change(reports):
    rows = failing(reports["no copy back"])
    assert rows and all(row.hint == ex02.HINT_COPY_BACK and "was not changed" in row.message for row in rows)
    for name in ("off by one", "one step short", "shifted", "hangs on three"):
        assert all(row.hint != ex02.HINT_COPY_BACK for row in reports[name].checks if row.outcome != "passed")


def test_a_correct_ring_on_another_schedule_scores_full_marks(reports):
    report = reports["shifted"]
    assert report.score == report.max_score, report.text()


def test_no_hint_demands_a_particular_chunk_layout():
    hints = [c.hint for c in get_exercise("02").checks] + [value for name, value in vars(ex02).items()
                                                           if name.startswith("HINT_")]
    assert not any("chunk r" in hint.replace("chunk r+", "") or "rank r should own" in hint for hint in hints)


def test_a_skipped_check_names_the_check_that_hung_and_checks_are_listed_in_the_order_they_ran(reports):
    report = reports["hangs on three"]
    checks = get_exercise("02").checks
    assert [row.name for row in report.checks] == [c.name for c in checks]
    hung = [row for row in report.checks if row.outcome == "timed_out"]
    assert len(hung) == 1 and checks[[c.name for c in checks].index(hung[0].name)].world == 3
    first_hang = [row.name for row in report.checks].index(hung[0].name)
    skipped = [row for row in report.checks if row.outcome == "not_run"]
    assert skipped, report.text()
    for row in skipped:
        assert f"in the check '{hung[0].name}'" in row.message and "did not finish (timed out)" in row.message
        assert [r.name for r in report.checks].index(row.name) > first_hang  # listed after the check it names
