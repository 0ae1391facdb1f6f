"""Exercise 10 (checkpoint and resume): each known mistake fails the check written for it, with its hint, and
no check it has no business failing; a right answer without DCP scores full marks; and the pieces the
checks stand on - the sampler, the scenarios, the count of what a process writes and receives, the picture
of the modules the runs train with - do what they say.

The graded cases share one launch (``grade_sources``: starting ranks is what grading spends its time on);
each check forks its own ranks from it (``grading/forked_worlds.py``). The reference answer's full marks are held by
``test_grading_solutions.py``, through the command line, like every exercise's.
"""
import os
import socket
import threading

import pytest

from dpteach.grading import get_exercise, grade_sources
from dpteach.grading.checks import ex10_checkpoint as ex10
from dpteach.grading.checks.ex10_runs import Scenario, training_changed
from dpteach.grading.checks.ex10_trainer import EPOCH, Sampler
from dpteach.grading.checks.ex10_observed import bytes_out, since
from answers.solutions import solution
from answers.wrong_variants import VARIANTS
from learners.checkpoint import (COURSE_SAVE_BY_NAME, DCP_GATHERED, KEEPS_NEWEST_TWO, MARKED_BEFORE_ALL_WROTE,
                                 OWN_FILE_ONLY, PATCHES_TRAINING, PER_RANK_FILES, READS_THE_GRADER, WRITES_ELSEWHERE,
                                 ZERO_FILLED)

CHECKS = [check.name for check in get_exercise("10").checks]
END_SAME, MOMENTUM, RNG, SAMPLER, END_FEWER, WRITES, END_MORE, EVERY_PIECE = range(8)
MISTAKES = {v.name: v.source() for v in VARIANTS if v.exercise == "10"}

# What each solution must fail, and the hint its own check gives. A forgotten piece also fails the
# end-to-end checks it changes (their message names the piece, their hint is the piece's); nothing else.
EXPECTED = {
    "no optimizer state saved: the momentum is lost":  # and no file holds a rank's shard: the writes check too
        ({END_SAME, MOMENTUM, END_FEWER, WRITES, END_MORE, EVERY_PIECE}, MOMENTUM, ex10.HINT_MOMENTUM),
    "no RNG state saved: each rank's input noise starts over": ({END_SAME, RNG, EVERY_PIECE}, RNG, ex10.HINT_RNG),
    "the sampler's place not saved: the data restarts at epoch 0":
        ({END_SAME, SAMPLER, END_FEWER, END_MORE, EVERY_PIECE}, SAMPLER, ex10.HINT_SAMPLER),
    "rank 0 gathers the optimizer shards and writes everything": ({WRITES}, WRITES, ex10.HINT_WRITES),
    "DCP after a gather to rank 0": ({WRITES}, WRITES, ex10.HINT_WRITES),
    "reads back only its own old file": ({END_FEWER, END_MORE}, END_FEWER, ex10.HINT_RESHARD),
    "one torch.save file per rank": (set(), None, None),
    "the newest two kept, older ones removed with shutil.rmtree": (set(), None, None),
}
# Graded with them, judged on one message only: its load then fails on files that are not there (an error, not
# a verdict, in every resume check).
WRITES_NOTHING = PER_RANK_FILES.replace("    torch.save(mine, os.path.join(folder, f\"rank{run.rank}.pt\"))\n", "")
SOURCES = {**MISTAKES, "DCP after a gather to rank 0": DCP_GATHERED, "reads back only its own old file": OWN_FILE_ONLY,
           "one torch.save file per rank": PER_RANK_FILES,
           "the newest two kept, older ones removed with shutil.rmtree": KEEPS_NEWEST_TWO,
           "a save that writes nothing": WRITES_NOTHING,
           "marked complete before every rank wrote": MARKED_BEFORE_ALL_WROTE,
           "zero-filled files of the right size": ZERO_FILLED}
# Solutions that score 0, and what the report must say about them.
ZERO = {"the course's own save, called by a name built at run time":
            (COURSE_SAVE_BY_NAME, "dpteach.training.checkpoint.save_checkpoint (called while your code ran)"),
        "checkpoints written outside the rank's scratch folder": (WRITES_ELSEWHERE, "outside this rank's own scratch"),
        "the course's ZeRO-1 replaced in the resumed run":
            (PATCHES_TRAINING, "replaced dpteach.sync.zero1.Zero1.step_optimizer, which the grader trains with"),
        "the uninterrupted run looked for in the grader's memory, through traceback.walk_tb":
            (READS_THE_GRADER, "called object.__getattr__ tb_frame, which reaches into the grader's frames")}


@pytest.fixture(scope="module")
def reports():
    sources = {**SOURCES, **{name: source for name, (source, _) in ZERO.items()}}
    names = sorted(sources)
    return dict(zip(names, grade_sources("10", [(sources[name], None) for name in names])))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_solution_fails_exactly_the_checks_meant_for_it_with_its_hint(reports, name):
    failing, own, hint = EXPECTED[name]
    report = reports[name]
    lost = {i for i, row in enumerate(report.checks) if not row.passed}
    assert lost == failing, (name, [CHECKS[i] for i in sorted(lost)], report.text())
    assert all(report.checks[i].outcome == "failed" for i in lost), report.text()
    if own is not None:
        assert report.checks[own].hint == hint, report.checks[own]
        # an end-to-end failure names the piece that differed right after loading, and gives that piece's hint
        for i in lost & {END_SAME, EVERY_PIECE}:
            assert report.checks[i].hint == hint, report.checks[i]
    else:
        assert report.score == report.max_score, report.text()


@pytest.mark.slow
def test_a_save_that_writes_nothing_is_told_so_not_that_its_state_left_through_another_rank(reports):
    message = reports["a save that writes nothing"].checks[WRITES].message
    assert "no rank wrote anything to disk" in message and "another rank" not in message, message


@pytest.mark.slow
def test_a_checkpoint_marked_complete_before_every_rank_wrote_fails_only_the_kills_inside_a_save(reports):
    """Right as long as every rank's save returns; the hidden checks kill a rank in the middle of its save and
    just before it, and the checkpoint being written then looks complete without that rank's file."""
    report = reports["marked complete before every rank wrote"]
    lost = {i for i, row in enumerate(report.checks) if not row.passed}
    assert lost == {END_MORE, EVERY_PIECE}, report.text()


@pytest.mark.slow
def test_zero_filled_files_of_the_right_size_fail_the_writes_check(reports):
    report = reports["zero-filled files of the right size"]
    assert not report.checks[WRITES].passed
    assert "holds rank" in report.checks[WRITES].message and "float32 bytes" in report.checks[WRITES].message
    assert not report.checks[MOMENTUM].passed and report.checks[RNG].passed


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ZERO))
def test_a_forbidden_call_or_tampering_inside_the_forked_ranks_scores_zero_and_is_named(reports, name):
    report, said = reports[name], ZERO[name][1]
    assert report.score == 0, report.text()
    assert any(said in text for text in report.forbidden + report.tampered), report.text()


@pytest.mark.slow
def test_the_reference_answer_at_another_w_ends_within_the_tolerance_and_a_kill_is_real():
    """What the try cell prints: a run killed for real on 2 ranks, resumed on 1."""
    namespace = {}
    exec(solution("10"), namespace)
    from dpteach.grading.checks.ex10_observed import try_resume
    gap = try_resume(namespace["save_checkpoint"], namespace["load_checkpoint"], before=2, after=1)
    assert 0.0 <= gap <= 1e-5


def test_the_sampler_gives_its_place_and_takes_it_back_and_refuses_what_is_not_one():
    sampler = Sampler(3)
    first = [sampler.next_batch() for _ in range(EPOCH + 1)]
    assert sampler.state_dict() == {"epoch": 1, "batch": 1}
    fresh = Sampler(3)
    fresh.load_state_dict({"epoch": 1, "batch": 0})
    assert fresh.next_batch() == first[EPOCH] and fresh.state_dict() == {"epoch": 1, "batch": 1}
    with pytest.raises(ValueError, match=r"state=\[1, 1\] is not allowed: give what state_dict\(\) returned"):
        fresh.load_state_dict([1, 1])
    with pytest.raises(ValueError, match=r"state\['batch'\]=3 is not allowed: it must be an integer in 0..2"):
        fresh.load_state_dict({"epoch": 0, "batch": 3})


@pytest.mark.parametrize("changes, message", [
    ({"kill": 4}, "kill=4 is not allowed: kill between two checkpoints"),
    ({"kill": 5, "strike": "in save"}, "kill=5 is not allowed: a kill in a save strikes at a checkpoint"),
    ({"kill": 2, "strike": "before save"}, "kill=2 is not allowed: it must be an integer in 4..7"),
    ({"strike": "later"}, "strike='later' is not allowed"),
    ({"after": 1, "noise": 0.5}, "noise=0.5 is not allowed: use 0.0 when W changes"),
    ({"before": 5}, "before=5 is not allowed: it must be an integer in 1..4"),
    ({"kill": 1}, "kill=1 is not allowed: it must be an integer in 2..7"),
    ({"victim": 2}, "victim=2 is not allowed: it must be an integer in 0..1"),
])
def test_a_scenario_that_cannot_be_told_is_refused_with_its_reason(changes, message):
    spec = dict(before=2, after=2, every=2, kill=5, steps=8)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Scenario(**{**spec, **changes}).check()


@pytest.mark.skipif(bytes_out() is None, reason="no /proc/self/io here")
def test_what_a_process_writes_to_files_is_told_apart_from_what_it_sends_and_receives(tmp_path):
    """gloo writes to its sockets with write(), which /proc/self/io's wchar counts with the files: the socket's
    share must come off, and what came in is counted apart."""
    server = socket.create_server(("127.0.0.1", 0))
    sender = socket.create_connection(server.getsockname())
    receiver, _ = server.accept()
    got = []

    def read(size=200_000):
        while size:
            size -= len(chunk := receiver.recv(min(size, 1 << 16)))
            got.append(len(chunk))

    reading = threading.Thread(target=read)
    reading.start()
    before = bytes_out()
    (tmp_path / "file").write_bytes(os.urandom(300_000))
    data = memoryview(os.urandom(200_000))
    while data:
        data = data[os.write(sender.fileno(), data):]
    reading.join()
    wrote, received = since(before)
    assert sum(got) == 200_000
    assert 300_000 <= wrote < 310_000  # the socket's 200 kB are not counted as written
    assert received == 200_000
    for sock in (sender, receiver, server):
        sock.close()


def test_a_change_to_the_modules_the_runs_train_with_is_seen():
    from dpteach.sync import zero1
    original = zero1.Zero1.finish
    assert training_changed() == []
    zero1.Zero1.finish = lambda self, step: None
    try:
        assert training_changed() == ["dpteach.sync.zero1.Zero1.finish"]
    finally:
        zero1.Zero1.finish = original
    assert training_changed() == []


def test_a_removal_by_name_in_an_open_directory_is_judged_where_it_happens(tmp_path):
    """shutil.rmtree removes files as os.unlink(name, dir_fd=fd): the name is in the directory, not the cwd."""
    from dpteach.grading import tampering
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        assert tampering._paths("os.remove", ("rank0.pt", fd)) == ([os.path.join(str(tmp_path), "rank0.pt")], True)
        assert tampering._paths("os.rename", ("a", "b", fd, None)) == ([os.path.join(str(tmp_path), "a"), "b"], True)
    finally:
        os.close(fd)
    assert tampering._paths("os.remove", ("/x/rank0.pt", None)) == (["/x/rank0.pt"], True)
