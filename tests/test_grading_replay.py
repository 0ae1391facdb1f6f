"""The replay that judges checks outside the ranks: recordings carry every value exactly, and a replayed
check reaches the verdict the rank reaches when nothing interferes (PyTorch itself is the oracle)."""
import pytest
import torch

from dpteach.grading.replay import ReplayContext, decode, encode, judge, record_call
from dpteach.grading.guard import Guard
from dpteach.grading.in_rank import Context
from dpteach.grading.spec import all_exercises


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
                                   torch.int32, torch.int8, torch.uint8, torch.bool])
def test_a_recorded_tensor_comes_back_bit_for_bit(dtype):
    source = (torch.randn(3, 4) * 50).to(dtype)
    for value in (source, source.t(), source[1], source[0, 0]):  # a view, a row, a 0-d tensor
        back = decode(encode(value))
        assert back.dtype == value.dtype and back.shape == value.shape and torch.equal(back, value)


def test_results_that_are_arguments_or_containers_keep_their_shape():
    a, b = torch.arange(4.0), torch.ones(2)
    recorded = encode((a, [b, 3, None], "x"), args=(a,))
    back = decode(recorded, args=(a,))
    assert back[0] is a and isinstance(back, tuple) and isinstance(back[1], list)
    assert torch.equal(back[1][0], b) and back[1][1:] == [3, None] and back[2] == "x"
    assert type(decode(encode(object()))).__name__ == "object"


def test_a_call_is_replayed_with_its_result_and_what_it_did_to_its_arguments():
    tensor = torch.arange(6.0)
    record = record_call("double_in_place", (tensor.mul_(2),), tensor)  # as if the learner doubled it in place
    fresh = torch.arange(6.0)
    ctx = ReplayContext(0, 1, [record])
    out = ctx.call("double_in_place", fresh)
    assert out is fresh and torch.equal(fresh, torch.arange(6.0) * 2)


def _exercise(key):
    return next(e for e in all_exercises() if e.id == key)


def test_replaying_a_correct_recording_passes_and_a_wrong_one_fails():
    """Exercise 02's W=1 check: the identity is the right all-reduce on one rank, doubling is not."""
    index = next(i for i, c in enumerate(_exercise("02").checks) if c.world == 1)

    def recording(result_of):
        from dpteach.grading.checks.common import rank_data
        mine = rank_data(21, 0, 7, torch.float32)
        after = result_of(mine.clone())
        return [{"sent": 0}, record_call("ring_all_reduce", (after,), after), {"sent": 0}]

    assert judge("02", index, 0, 1, recording(lambda t: t))["outcome"] == "passed"
    wrong = judge("02", index, 0, 1, recording(lambda t: t.mul_(2)))
    assert wrong["outcome"] == "failed" and "differ from the sum" in wrong["message"]


def test_a_check_that_reaches_for_live_objects_sends_no_recording():
    """Handing out the learner's object, giving a call a model, or communicating on its own: the rank's
    context says the check cannot be replayed (exercises 04, 05, 07 and 08 do each of these)."""
    namespace = {"same": lambda *values: values[0]}

    def context():
        return Context(0, 1, namespace, Guard(), learner_files=set())

    ctx = context()
    ctx.call("same", torch.ones(2), [1, 2.5, None], "text")
    assert ctx.replayable and len(ctx.recording) == 1
    ctx = context()
    ctx.call("same", torch.nn.Linear(2, 2))
    assert not ctx.replayable
    for reach in (lambda c: c.learner("same"), lambda c: c.allow(), lambda c: c.running_learner_code()):
        ctx = context()
        reach(ctx)
        assert not ctx.replayable
