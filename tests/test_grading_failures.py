"""What the grader does with code that breaks: forbidden calls, hangs, deadlocks, exceptions, bad cells.

Each case runs on real ranks, on one or two checks only (``only=``), with shortened time limits
(``limit_scale``), and cases of one exercise share their worlds (``grade_sources``), to keep the suite
quick; the behaviour is the same as a full grading.
"""
import os
import time
from pathlib import Path

import pytest

from dpteach.grading import get_exercise, grade_namespace, grade_source, grade_sources
from dpteach.grading.forbidden import scan
from answers.solutions import solution

EX01 = get_exercise("01")


def index_of(exercise, piece: str) -> int:
    return next(i for i, check in enumerate(exercise.checks) if piece in check.name)


RS_W1 = index_of(EX01, "reduce_scatter: W=1")
RS_W2 = index_of(EX01, "reduce_scatter: W=2")
AG_W2 = index_of(EX01, "all_gather: W=2")


def edited(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def is_zygote(entry: Path) -> bool:
    """The zygote is this process's child; the ranks it forks are its children and share its command line."""
    try:
        parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        return parent == os.getpid() and b"dpteach.ranks.zygote" in (entry / "cmdline").read_bytes()
    except OSError:
        return False


def live_ranks_started_by_us() -> list[int]:
    """Processes (any depth) that a launch from this test process started and that are still running.

    A rank forked by the zygote shows the zygote's start-up environment in /proc, which carries the same mark;
    the zygote itself (kept for the next launch) is not a rank."""
    if not Path("/proc").is_dir():
        pytest.skip("needs /proc (Linux) to list processes")
    mine = f"DPTEACH_LAUNCHER_PID={os.getpid()}".encode()
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if state != "Z" and mine in environ.split(b"\0") and not is_zygote(entry):
            alive.append(int(entry.name))
    return alive


# The broken submissions of exercise 01 (and of 02) are graded together, once, in shared worlds
# (grade_sources): each test below reads its own report. A hang still costs its own world.
STATIC = solution("01") + "\n\ndef unused(t):\n    dist.all_reduce(t)\n"
HIDDEN = edited(solution("01"), "    buf = tensor.detach().reshape(-1).clone()\n",
                "    buf = tensor.detach().reshape(-1).clone()\n    getattr(dist, 'all_' + 'reduce')(buf)\n")
LOOP = edited(solution("01"), "    out = torch.empty(numel, dtype=chunk.dtype)\n", "    while True:\n        pass\n")
DEADLOCK = edited(solution("01"), "exchange(buf[s0:s1], right, inbox[:r1 - r0], left)",  # all receive first
                  "dist.recv(inbox[:r1 - r0], left)\n        dist.send(buf[s0:s1], right)")
HELPER = edited(solution("02"), "    bounds = chunk_bounds(buf.numel(), world)\n",
                "    bounds = split(buf.numel(), world)\n") + \
    "\n\ndef split(numel, world):\n    return chunk_bounds(numel, world - world)\n"
ONE_RANK = edited(solution("02"), "    world, rank = dist.get_world_size(), dist.get_rank()\n",
                  "    world, rank = dist.get_world_size(), dist.get_rank()\n"
                  "    if rank == 1:\n        raise KeyError('only rank 1 fails')\n")


@pytest.fixture(scope="module")
def broken_01():
    started = time.monotonic()
    reports = grade_sources("01", [(STATIC, [RS_W1]), (HIDDEN, [RS_W2]), (LOOP, [RS_W2, AG_W2]),
                                   (DEADLOCK, [RS_W1, RS_W2])], limit_scale=0.5)
    return dict(zip(("static", "hidden", "loop", "deadlock"), reports)), time.monotonic() - started


@pytest.fixture(scope="module")
def broken_02():
    return dict(zip(("helper", "one_rank"), grade_sources("02", [(HELPER, [0]), (ONE_RANK, [1])], limit_scale=0.5)))


@pytest.mark.slow
def test_a_built_in_collective_found_by_reading_scores_zero_with_the_line(broken_01):
    report = broken_01[0]["static"]
    line = STATIC.splitlines().index("    dist.all_reduce(t)") + 1
    assert report.score == 0 and report.status == "failed"
    assert report.forbidden == [f"torch.distributed.all_reduce (<exercise 01 solution, cell 1>, line {line}; "
                                f"found in the code)"]
    assert "SCORE 0" in report.text() and f"line {line}" in report.text()
    assert report.checks[RS_W1].passed and report.checks[RS_W1].earned == 0  # honest: it works, and scores 0


@pytest.mark.slow
def test_a_built_in_collective_hidden_from_reading_is_caught_while_it_runs(broken_01):
    assert scan(EX01, {"<cell>": HIDDEN}) == []
    report = broken_01[0]["hidden"]
    assert report.score == 0
    assert report.forbidden == ["torch.distributed.all_reduce (called while your code ran)"]
    assert report.checks[RS_W2].outcome == "forbidden"
    assert "not allowed in this exercise" in report.checks[RS_W2].message


@pytest.mark.slow
def test_an_endless_loop_times_out_and_leaves_no_process_behind(broken_01):
    reports, seconds = broken_01
    assert seconds < 90  # two hangs, each one time limit and one new world
    report = reports["loop"]
    assert report.checks[RS_W2].passed  # the other function still gets its points
    row = report.checks[AG_W2]
    assert (row.outcome, row.passed) == ("timed_out", False)
    assert "timed out after 3 s on W=2" in row.message and "deadlock" in row.message
    assert live_ranks_started_by_us() == []


@pytest.mark.slow
def test_a_deadlock_times_out_and_leaves_no_process_behind(broken_01):
    report = broken_01[0]["deadlock"]
    assert report.checks[RS_W1].passed  # one rank has no one to wait for
    assert report.checks[RS_W2].outcome == "timed_out"
    assert live_ranks_started_by_us() == []


@pytest.mark.slow
def test_an_exception_shows_the_learners_lines_only(broken_02):
    row = broken_02["helper"].checks[0]
    line = HELPER.splitlines().index("    bounds = split(buf.numel(), world)") + 1
    assert row.outcome == "error"
    lines = row.message.splitlines()
    assert lines[0] == "Traceback (your code only, most recent call last):"
    assert f'File "<exercise 02 solution, cell 1>", line {line}, in ring_all_reduce' in row.message
    assert "bounds = split(buf.numel(), world)" in row.message
    assert "in split" in row.message and lines[-1].startswith("ZeroDivisionError")
    assert "dpteach" not in row.message.replace("<exercise", "") and "site-packages" not in row.message


@pytest.mark.slow
def test_an_exception_on_one_rank_is_reported_with_its_traceback_not_as_a_time_out(broken_02):
    row = broken_02["one_rank"].checks[1]
    assert row.outcome == "error" and row.message.startswith("rank 1: Traceback")
    assert "KeyError: 'only rank 1 fails'" in row.message and "left waiting for rank 1" in row.message
    assert live_ranks_started_by_us() == []


def test_a_syntax_error_is_reported_before_any_rank_starts():
    report = grade_source("03", "def assign_buckets(sizes, cap_bytes, first_cap_bytes)\n    return []\n",
                          record=False)
    assert report.status == "error" and report.score == 0
    assert report.error.startswith("SyntaxError in <exercise 03 solution, cell 1>, line 1")


@pytest.mark.slow
def test_top_level_code_that_raises_is_an_error_with_its_traceback():
    source = solution("03") + "\nprint(undefined_name)\n"
    report = grade_source("03", source, record=False, only=[0])
    assert report.status == "error"
    assert f"line {len(source.splitlines())}, in <module>" in report.error and "NameError" in report.error
    assert "not run: the code could not be loaded" in report.checks[0].message


@pytest.mark.slow
def test_a_class_defined_in_a_notebook_is_graded_from_the_namespace_like_check_does():
    """check() takes the learner's objects from the notebook's globals and sends them to the ranks by
    value; a class's source (for "not attempted" and the static scan) is found through its methods."""
    import linecache
    source, filename = solution("04"), "/tmp/ipykernel_0/123456.py"  # how IPython names a cell
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"__name__": "__main__"}
    exec(compile(source, filename, "exec"), namespace)
    exercise = get_exercise("04")
    only = [i for i, c in enumerate(exercise.checks) if "during backward" in c.name]
    report = grade_namespace("04", namespace, record=False, only=only)
    assert report.checks[only[0]].passed, report.checks[only[0]].message
    broken = source.replace("            p.grad.copy_(view / world)\n", "            p.grad.copy_(view)\n")
    linecache.cache[filename] = (len(broken), None, broken.splitlines(True), filename)
    exec(compile(broken, filename, "exec"), namespace)
    first = [i for i, c in enumerate(exercise.checks) if "every .grad is the average" in c.name]
    report = grade_namespace("04", namespace, record=False, only=first)
    assert "divide by W" in report.checks[first[0]].message
    del linecache.cache[filename]


@pytest.mark.slow
def test_an_endless_loop_at_the_top_of_a_cell_is_an_error_and_other_submissions_still_run(monkeypatch):
    from dpteach.grading import runner
    monkeypatch.setattr(runner, "LOAD_LIMIT", 3.0)
    looping, fine = solution("03") + "\nwhile True:\n    pass\n", solution("03")
    stuck, graded = grade_sources("03", [(looping, [0]), (fine, [0])])
    assert stuck.status == "error" and "endless loop" in stuck.error
    assert graded.checks[0].passed
    assert live_ranks_started_by_us() == []


def _blamed(per_rank: dict, timeout, failure):
    from dpteach.grading.report import CheckResult
    from dpteach.grading.runner import blame
    row = CheckResult(name="reduce_scatter: W=2", points=5, hidden=False)
    blame(row, EX01.checks[RS_W2], per_rank, timeout, failure, 1.0)
    return row


def test_an_error_raised_after_a_peers_watchdog_fired_is_its_echo_and_the_row_says_timed_out():
    # A deadlock: rank 0's watchdog fires first; rank 1's receive then fails ("connection reset by peer")
    # before its own watchdog fires. That exception is a consequence of the hang, not the learner's bug.
    from dpteach.grading.in_rank import WATCHDOG_EXIT_CODE
    from dpteach.ranks.launcher import RankError
    echo = {"rank": 1, "outcome": "error", "at": 100.25, "message": "RuntimeError: Connection reset by peer"}
    timeout = {"event": "timeout", "rank": 0, "at": 100.2}
    died = RankError(0, f"exited with code {WATCHDOG_EXIT_CODE}", exit_code=WATCHDOG_EXIT_CODE)
    row = _blamed({1: echo}, timeout, died)
    assert row.outcome == "timed_out" and "deadlock" in row.message
    # The same exception raised *before* any watchdog fired is the cause, and is reported as such.
    row = _blamed({1: dict(echo, at=100.1)}, timeout, died)
    assert row.outcome == "error" and row.message.startswith("rank 1: RuntimeError: Connection reset")


def test_when_every_rank_reports_an_error_the_first_is_the_cause_and_the_others_its_echo():
    # Under load the peer of a raising rank may record its own failure ("connection reset by peer")
    # before the launcher stops it: then every rank has a record, and the merge must still blame the
    # first exception and say that the others were waiting for it (seen once in a loaded full run).
    from dpteach.grading.report import CheckResult
    from dpteach.grading.runner import merge_ranks
    cause = {"rank": 1, "outcome": "error", "at": 5.0, "message": "KeyError: 'only rank 1 fails'"}
    echo = {"rank": 0, "outcome": "error", "at": 5.2, "message": "RuntimeError: Connection reset by peer"}
    row = CheckResult(name="W=2", points=2, hidden=False)
    merge_ranks(row, {0: echo, 1: cause})
    assert row.outcome == "error" and row.message.startswith("rank 1: KeyError: 'only rank 1 fails'")
    assert "left waiting for rank 1" in row.message
    alone = CheckResult(name="W=2", points=2, hidden=False)
    merge_ranks(alone, {0: {"rank": 0, "outcome": "passed", "at": 5.2, "message": ""}, 1: cause})
    assert alone.message == "rank 1: KeyError: 'only rank 1 fails'"  # nobody waited: nothing to add


def test_a_world_that_broke_outside_any_code_under_test_is_retried_and_anything_else_is_not():
    from dpteach.grading.runner import failed_outside_any_code_under_test as infrastructure
    from dpteach.ranks.launcher import RankError
    joining = RankError(1, "raised RuntimeError: Gloo connectFullMesh failed", exit_code=1, exc_type="RuntimeError")
    assert infrastructure(joining, {}, None)
    # ... but not when the learner's code raised, a watchdog fired, or a rank died without an exception
    assert not infrastructure(joining, {0: {"rank": 0, "outcome": "error", "at": 1.0}}, None)
    assert not infrastructure(joining, {}, {"event": "timeout", "rank": 0, "at": 1.0})
    assert not infrastructure(RankError(0, "was killed by SIGSEGV", exit_code=-11), {}, None)
