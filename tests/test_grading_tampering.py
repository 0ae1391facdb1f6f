"""The grader fails closed: a solution that wins by interfering with the checks scores no more than doing nothing.

Each tampering solution in ``tests/learners/fail_closed.py`` scored full marks before issue 27 was fixed,
each by another hole: a check module's helper replaced, a check's code swapped (and the replay, unable to
replay it, let the rank's verdict stand), the recording switched off, torch left dispatching through a mode
or through methods added to ``torch.Tensor``, the expected value read from the check's frame or rebuilt
from the grader's helpers, and results exchanged through files instead of messages. Graded on real ranks,
each one alone (tampering in a rank would spill into the next submission sharing it), each must score at
most what an untouched exercise scores, and the report must say what was done where the grader can tell.

The parts below need no ranks: the rule that only two passes make a pass (``judge.py``), recordings that
keep which tensors share memory, the seal's view of torch's dispatch, the audit hook (in a process of its
own: a hook cannot be removed), the signature on the ranks' verdicts, and the traffic counter.
"""
import json
import subprocess
import sys
import textwrap

import pytest
import torch

from dpteach.grading import get_exercise, grade_source, grade_sources
from dpteach.grading.judge import rejudge
from dpteach.grading.replay import decode, encode, judge, record_call
from learners.fail_closed import CASES

# What the report must name, per case: the tampering it saw, or - for files - that nothing ever came: each rank
# writes into a scratch folder of its own (TMPDIR) and may not open another's, so the ranks wait for files
# that never appear.
NAMED = {
    "a helper of the check module replaced (08)": ("tampered", "ex08_zero1.zero_trajectory"),
    "the check's code swapped (05)": ("tampered", "it changed the code of ex05_accumulation.accumulation_case"),
    "the recording switched off (02)": ("tampered", "gc.get_objects"),
    "a TorchFunctionMode left active (08)": ("tampered", "modes active: _Agreeable"),
    "a TorchDispatchMode left active (09)": ("tampered", "torch dispatch modes"),
    "methods added to torch.Tensor (03)": ("tampered", "torch.Tensor.mul_ (added)"),
    "the expected sum read from the check's frame (02)": ("tampered", "sys._getframe"),
    "the expected sum rebuilt from the grader's helpers (02)": ("tampered", "the grader's own sum_over_ranks"),
    "pushes and replies through files (07)": ("timed_out", "timed out"),
    "gradients through files (08)": ("timed_out", "timed out"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_tampering_solution_scores_no_more_than_doing_nothing_and_the_report_says_why(name):
    exercise, source = CASES[name]
    untouched = grade_source(exercise, get_exercise(exercise).stub, record=False)
    (report,) = grade_sources(exercise, [(source, None)])
    assert untouched.status == "not_attempted"
    assert report.score <= untouched.score == 0, report.text()
    outcome, words = NAMED[name]
    rows = [row for row in report.checks if row.outcome == outcome]
    assert rows and any(words in row.message for row in rows), report.text()
    if outcome == "tampered":
        assert any(words in text for text in report.tampered) and "SCORE 0" in report.text()


def test_every_tampering_solution_is_named_in_the_test():
    assert set(NAMED) == set(CASES)


# -- only two passes make a pass ------------------------------------------------------------------------

class _Judge:
    def __init__(self, verdicts=None, fails=False):
        self.answers, self.fails, self.asked = verdicts or {}, fails, []

    def verdicts(self, requests):
        self.asked += requests
        if self.fails:
            raise RuntimeError("the judging process exited with code 1")
        return {r["key"]: self.answers.get(r["key"], {"outcome": "passed", "message": ""}) for r in requests}


def _finished(*records):
    return {(0, 0): {rank: dict(record, rank=rank, message=record.get("message", ""))
                     for rank, record in enumerate(records)}}


def test_a_pass_without_its_recording_is_tampering_and_a_failure_is_never_upgraded():
    finished = _finished({"outcome": "passed"}, {"outcome": "failed", "message": "wrong", "recording": []})
    judge_ = _Judge()
    rejudge("02", finished, judge_)
    assert judge_.asked == []  # nothing to replay: the failure stays, the pass has no record
    record, failure = finished[(0, 0)][0], finished[(0, 0)][1]
    assert record["outcome"] == "tampered" and "switched the recording off" in record["message"]
    assert (failure["outcome"], failure["message"]) == ("failed", "wrong")


@pytest.mark.parametrize("verdict, outcome, words", [
    ({"outcome": "failed", "message": "the values differ"}, "tampered", "judged again outside them"),
    ({"outcome": "not_replayable", "message": "the check asked for 'call'"}, "tampered", "could not retrace"),
    ({"outcome": "grader_error", "message": "KeyError: 3"}, "grader_error", "does not count"),
    ({"outcome": "passed", "message": ""}, "passed", ""),
])
def test_a_pass_counts_only_when_the_replay_passes_too(verdict, outcome, words):
    finished = _finished({"outcome": "passed", "recording": [], "changed_code": ["common.rank_data"]})
    rejudge("02", finished, _Judge({"0/0/0": verdict}))
    record = finished[(0, 0)][0]
    assert record["outcome"] == outcome and words in record["message"]
    if outcome == "tampered":
        assert "it changed the code of common.rank_data" in record["message"]


def test_no_judging_process_means_no_pass():
    finished = _finished({"outcome": "passed", "recording": []})
    rejudge("02", finished, _Judge(fails=True))
    assert finished[(0, 0)][0]["outcome"] == "grader_error"


def test_a_recording_that_holds_more_than_the_check_asks_for_cannot_be_replayed():
    index = next(i for i, c in enumerate(get_exercise("02").checks) if c.world == 1)
    from dpteach.grading.checks.common import rank_data
    mine = rank_data(21, 0, 7, torch.float32)
    recording = [{"sent": 0}, record_call("ring_all_reduce", (mine,), mine), {"sent": 0}]
    assert judge("02", index, 0, 1, recording)["outcome"] == "passed"
    assert judge("02", index, 0, 1, recording + [{"sent": 5}])["outcome"] == "not_replayable"
    assert judge("02", index, 0, 1, recording[:1])["outcome"] == "not_replayable"


# -- recordings keep memory sharing; subclasses are not tensors there --------------------------------------

def test_a_recording_keeps_views_of_one_buffer_and_views_of_an_argument():
    flat = torch.arange(6.0)
    back_flat, (first, second) = decode(encode((flat, [flat[:2].view(2, 1), flat[2:]])))
    back_flat.mul_(10)
    assert torch.equal(first.reshape(-1), torch.tensor([0.0, 10.0])) and torch.equal(second, flat[2:] * 10)
    grad = torch.arange(4.0)
    record = record_call("flatten", (grad,), grad[1:3])  # a "new" buffer that is the argument's memory
    from dpteach.grading.replay import ReplayContext
    fresh = torch.zeros(4)
    out = ReplayContext(0, 1, [record]).call("flatten", fresh)
    out.zero_()
    assert torch.equal(fresh, torch.tensor([0.0, 0.0, 0.0, 3.0]))  # the replay's argument changed with it


def test_a_tensor_subclass_is_recorded_by_its_name_only():
    class Agreeable(torch.Tensor):
        pass

    back = decode(encode(torch.ones(3).as_subclass(Agreeable)))
    assert not isinstance(back, torch.Tensor) and type(back).__name__ == "Agreeable"


# -- the seal sees torch's dispatch, the grader's modules and classes ----------------------------------

def test_the_seal_sees_modes_added_methods_and_replaced_helpers_and_nothing_else():
    from torch.overrides import TorchFunctionMode

    from dpteach.grading.checks import ex08_zero1
    from dpteach.grading.seal import Seal
    seal = Seal()
    assert seal.problems(final=True) == []
    with TorchFunctionMode():
        assert "torch function modes" in " ".join(seal.problems())
    torch.Tensor.equal = lambda self, other: True
    try:
        assert "torch.Tensor.equal (added)" in seal.broken()
    finally:
        del torch.Tensor.equal
    original = ex08_zero1.zero_trajectory
    ex08_zero1.zero_trajectory = lambda *args: None
    try:
        assert "dpteach.grading.checks.ex08_zero1.zero_trajectory" in seal.broken()
    finally:
        ex08_zero1.zero_trajectory = original
    assert seal.problems(final=True) == []


# -- the audit hook, in a process of its own ----------------------------------------------------------------

AUDITED = textwrap.dedent('''
    import json
    from dpteach.grading import tampering
    tampering.install()
    cell = """
    import collections, gc, inspect, logging, sys, traceback
    def frame(): return sys._getframe(1)
    def via_inspect(): return inspect.currentframe().f_back
    def referrers(): return gc.get_referrers(frame)
    def named(): return collections.namedtuple("Pair", "a b")
    def logged(): logging.getLogger("quiet").info("nothing")
    def printed():
        try:
            1 / 0
        except ZeroDivisionError:
            return traceback.format_exc()
    def written(): open(tampering.GRADING_DIR + "evil.py", "w")
    def memory(): open("/proc/self/mem", "rb")
    """
    space = {"tampering": tampering}
    exec(compile(cell, "<exercise 02 solution, cell 1>", "exec"), space)
    seen = {}
    for name in ("frame", "via_inspect", "referrers", "named", "logged", "printed", "written", "memory"):
        before = len(tampering.notes())
        try:
            space[name]()
        except PermissionError:
            pass
        seen[name] = list(tampering.notes()[before:])
    print(json.dumps(seen))
''')


def test_the_audit_hook_notes_reaching_into_frames_and_the_grader_files_not_ordinary_library_use():
    result = subprocess.run([sys.executable, "-c", AUDITED], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    for name in ("frame", "via_inspect", "referrers"):
        assert seen[name] and "reaches into the grader's frames" in seen[name][0], (name, seen)
    assert seen["written"] and seen["memory"] and all("opened" in seen[name][0] for name in ("written", "memory"))
    assert seen["named"] == seen["logged"] == seen["printed"] == []


# -- the verdicts the ranks write are signed -------------------------------------------------------------

def test_only_verdicts_signed_with_the_launchs_key_are_read():
    from dpteach.grading.in_rank import sign
    from dpteach.grading.runner import _genuine
    key = b"k" * 32
    record = {"event": "check", "job": 0, "check": 1, "rank": 0, "outcome": "passed"}
    assert _genuine(dict(record, mac=sign(key, record)), key)
    assert not _genuine(dict(record), key)  # appended by code in the rank, without the key
    assert not _genuine(dict(record, mac=sign(b"x" * 32, record)), key)
    assert not _genuine(dict(record, outcome="failed", mac=sign(key, record)), key)
    assert _genuine({"event": "timeout", "check": [0, 1], "rank": 0}, key)  # a time-out can only cost points


# -- the bytes that really crossed the process group -------------------------------------------------------

def _bytes_through_the_group():
    import torch.distributed as dist
    from dpteach.grading.guard import Traffic
    traffic, rank = Traffic(), dist.get_rank()
    store = dist.distributed_c10d._get_default_store()
    traffic.before_world()
    group = dist.new_group([0, 1])
    traffic.world_started()
    before = traffic.received()
    payload = torch.ones(1000)
    if rank == 0:
        dist.send(payload, 1, group=group)
    else:
        dist.recv(payload, 0, group=group)
    store.set(f"through the store {rank}", "x" * 10000)  # another channel: not counted
    dist.barrier(group=group)
    after = traffic.received()
    return None if before is None else after - before


def test_the_traffic_counter_counts_what_crosses_the_group_and_not_the_store():
    import dpteach
    received = dpteach.launch(_bytes_through_the_group, 2, backend="gloo", device="cpu", timeout=60,
                              show_output=False, progress=False)
    if received[0] is None:
        pytest.skip("this machine cannot count a socket's bytes (TCP_INFO under /proc is Linux's)")
    assert received[1] >= 4000 > received[0]  # rank 1 received the 1000 floats; rank 0 only a barrier's bytes
    assert received[1] < 4000 + 2000
