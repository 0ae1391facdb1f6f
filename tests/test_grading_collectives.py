"""The forbidden collectives are read from torch itself, so what a new torch adds is covered the day it ships:
torch 2.13's ``dist.reduce_scatter_single`` and ``dist.all_gather_single`` were in no hand-written list.
Each exercise still allows what it allowed; point-to-point messages and barriers are never forbidden."""
import pytest
import torch
import torch.distributed as dist

from dpteach.grading import get_exercise, grade_sources
from dpteach.grading import spec
from dpteach.grading.forbidden import scan
from learners.builtins import CALLS, RING_02, solution

BEFORE = {  # the hand-written lists this derivation replaced: nothing in them may be allowed now
    "functions": ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all",
                  "all_to_all_single", "reduce_scatter_tensor", "all_gather_into_tensor", "all_gather_object",
                  "broadcast_object_list", "gather", "scatter", "gather_object", "scatter_object_list",
                  "all_reduce_coalesced", "all_gather_coalesced", "_all_gather_base", "_reduce_scatter_base",
                  "_broadcast_coalesced"),
    "methods": ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "alltoall", "alltoall_base",
                "allreduce_coalesced", "allgather_coalesced", "_allgather_base", "_reduce_scatter_base",
                "allgather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced", "gather", "scatter"),
}
POINT_TO_POINT = ("send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list", "recv_object_list")
NEW = ("torch.distributed.reduce_scatter_single", "torch.distributed.all_gather_single")


def test_the_derived_lists_cover_the_old_ones_and_torch_2_13s_new_collectives():
    assert {f"torch.distributed.{name}" for name in BEFORE["functions"]} <= set(spec.TORCH_COLLECTIVES)
    assert set(BEFORE["methods"]) <= set(spec.PROCESS_GROUP_METHODS)
    if hasattr(dist, "reduce_scatter_single"):
        assert set(NEW) <= set(spec.TORCH_COLLECTIVES)
        assert {"reduce_scatter_single", "all_gather_single"} <= set(spec.PROCESS_GROUP_METHODS)


def test_point_to_point_messages_barriers_and_queries_are_never_collectives():
    allowed = POINT_TO_POINT + ("barrier", "monitored_barrier", "init_process_group", "new_group", "get_rank",
                                "get_world_size", "destroy_process_group", "_coalescing_manager")
    assert not {f"torch.distributed.{name}" for name in allowed} & set(spec.TORCH_COLLECTIVES)
    assert not {"send", "recv", "recv_anysource", "barrier", "monitored_barrier"} & set(spec.PROCESS_GROUP_METHODS)


def test_a_collective_that_a_new_torch_adds_is_found_without_naming_it(monkeypatch):
    def all_reduce_single(tensor, group=None, async_op=False):
        return group.allreduce([tensor])

    all_reduce_single.__module__ = dist.distributed_c10d.__name__  # where torch defines its collectives
    monkeypatch.setattr(dist, "all_reduce_single", all_reduce_single, raising=False)
    assert "torch.distributed.all_reduce_single" in spec.torch_collectives()

    class Group:  # a ProcessGroup as pybind11 describes it: a signature line per method in its docstring
        def scatter_single(self):
            """scatter_single(self: ProcessGroup, output: torch.Tensor, input: torch.Tensor) -> c10d::Work"""

        def send_tensors(self):
            """send_tensors(self: ProcessGroup, tensors: list[torch.Tensor], dstRank: int) -> None"""

        def barrier(self):
            """barrier(self: ProcessGroup, opts: BarrierOptions = ...) -> c10d::Work"""

        def send(self):
            """send(self: ProcessGroup, tensors: list[torch.Tensor], dstRank: int, tag: int) -> c10d::Work"""

    assert spec.process_group_collectives(Group) == ("scatter_single",)


def test_every_exercise_keeps_what_it_allows_and_forbids_what_it_forbade():
    for key in ("01", "02", "05", "07"):
        exercise = get_exercise(key)
        assert set(NEW) <= set(exercise.forbidden) or not hasattr(dist, "reduce_scatter_single"), key
        assert not {f"torch.distributed.{name}" for name in POINT_TO_POINT} & set(exercise.forbidden), key
    ex04 = get_exercise("04")
    assert "torch.distributed.all_reduce" not in ex04.forbidden and "allreduce" not in ex04.forbidden_methods
    assert set(spec.TORCH_COLLECTIVES) - set(ex04.forbidden) == {"torch.distributed.all_reduce"}
    for key in ("08", "09"):  # all-reduce only: reduce-scatter and all-gather are the point of ZeRO
        exercise = get_exercise(key)
        torch_names = {name for name in exercise.forbidden if name.startswith("torch.")}
        assert torch_names == {"torch.distributed.all_reduce", "torch.distributed.all_reduce_coalesced"}, key
        assert set(exercise.forbidden_methods) == {"allreduce", "allreduce_coalesced"}, key


@pytest.mark.parametrize("exercise", ["01", "02"])
def test_reading_the_code_finds_the_new_collectives_and_their_process_group_methods(exercise):
    if not hasattr(dist, "reduce_scatter_single"):
        pytest.skip(f"torch {torch.__version__} has no dist.reduce_scatter_single")
    found = {o.name for o in scan(get_exercise(exercise), {"<cell>": solution("dist.*_single")})}
    assert found == set(NEW)
    found = {o.name for o in scan(get_exercise(exercise), {"<cell>": solution("ProcessGroup methods")})}
    assert found == {"ProcessGroup.reduce_scatter_single", "ProcessGroup.all_gather_single"}
    assert scan(get_exercise(exercise), {"<cell>": solution("hidden from reading")}) == []


@pytest.mark.slow
def test_solutions_built_on_the_new_collectives_score_zero_read_or_hidden():
    if not hasattr(dist, "reduce_scatter_single"):
        pytest.skip(f"torch {torch.__version__} has no dist.reduce_scatter_single")
    names = sorted(CALLS)
    reports = grade_sources("01", [(solution(name), None) for name in names])
    for name, report in zip(names, reports):
        assert report.score == 0 and "SCORE 0" in report.text(), name
        assert f"{CALLS[name][2]} (called while your code ran)" in report.forbidden, (name, report.forbidden)
        assert any(row.outcome == "forbidden" for row in report.checks), name
    (ring,) = grade_sources("02", [(RING_02, None)])
    assert ring.score == 0 and any(text.startswith("torch.distributed.reduce_scatter_single (<exercise 02")
                                   for text in ring.forbidden), ring.forbidden
