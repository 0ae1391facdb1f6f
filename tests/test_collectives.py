"""Every hand-written collective must equal torch's own, on real gloo worlds of 1 to 4 ranks.

One launch per world size runs all cases (starting ranks costs seconds; comparing costs nothing)
and returns what each case produced; the tests below then check each property separately.
"""
import doctest

import pytest
import torch
import torch.distributed as dist

import dpteach
import dpteach.collectives.ring as ring
from dpteach.collectives import (ALL_REDUCE, chunk_bounds, ring_all_gather, ring_all_reduce,
                                 ring_reduce_scatter)
from dpteach.collectives._p2p import on_the_wire
from dpteach.collectives.ring import ring_schedule

LENGTHS = (1, 3, 7, 64, 1001)           # fewer elements than ranks, not divisible by W, larger
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.int16,
          torch.int8)


def _data(rank, n, dtype, salt):
    g = torch.Generator().manual_seed(1000 * rank + 7 * n + salt)
    # small integers: every sum is exact in every dtype, so any difference is a real bug
    return torch.randint(-3, 4, (n,), generator=g).to(dtype)


def _expected(x, op):
    ref = x.clone().to(torch.float64)
    dist.all_reduce(ref)  # torch's own all-reduce is the oracle
    if op == "avg":
        if x.is_floating_point():
            return (ref / dist.get_world_size()).to(x.dtype)
        return torch.div(ref, dist.get_world_size(), rounding_mode="floor").to(x.dtype)
    return ref.to(x.dtype)


def _ring_trace_and_traffic(n, pieces):
    """One traced ring all-reduce; beside its trace, the elements of ``x`` it really handed to the wire.

    Every send the ring passes to ``exchange`` or ``post`` is a view of ``x`` (a flat, contiguous
    tensor is its own work buffer), so its offset in ``x`` says which elements left, in call order.
    """
    x = torch.arange(n, dtype=torch.float32) * (dist.get_rank() + 1)
    expected = _expected(x, "sum")
    base, sent, real = x.data_ptr(), [], (ring.exchange, ring.post)

    def wire(send):
        if send is not None and send.numel():
            start = (send.data_ptr() - base) // send.element_size()
            sent.extend(range(start, start + send.numel()))

    def exchange(send, dst, recv, src, group=None):
        wire(send)
        return real[0](send, dst, recv, src, group)

    def post(send, dst, recv, src, group=None):
        wire(send)
        return real[1](send, dst, recv, src, group)

    ring.exchange, ring.post = exchange, post
    try:
        trace = []
        ring_all_reduce(x, trace=trace, pieces=pieces)
    finally:
        ring.exchange, ring.post = real
    return trace, sent, torch.equal(x, expected)


RING_TRACE_LENGTHS = (3, 10)  # 3: at W=4 the last chunk is empty, and pieces=3 cuts empty pieces


def _all_cases():
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {"mismatch": [], "traces": {}, "rs_ag": [], "shapes": []}
    salt = 0
    for name, all_reduce in [*ALL_REDUCE.items(), ("ring_pipelined", None)]:
        for n in LENGTHS:
            for dtype in DTYPES:
                for op in ("sum", "avg"):
                    salt += 1
                    x = _data(rank, n, dtype, salt)
                    expected = _expected(x, op)
                    got = x.clone()
                    if all_reduce is None:
                        ring_all_reduce(got, op=op, pieces=3)
                    else:
                        all_reduce(got, op=op)
                    if not torch.equal(got, expected):
                        out["mismatch"].append((name, n, str(dtype), op))
    # reduce-scatter returns chunk r; all-gather of those chunks restores the whole
    for n in LENGTHS:
        x = _data(rank, n, torch.float32, n)
        expected = _expected(x, "sum")
        start, stop = chunk_bounds(n, world)[rank]
        mine = ring_reduce_scatter(x)
        whole = ring_all_gather(mine)
        out["rs_ag"].append((n, torch.equal(mine, expected[start:stop]), torch.equal(whole, expected),
                             torch.equal(x, _data(rank, n, torch.float32, n))))
    # shapes are kept (a 2-D, non-contiguous tensor)
    m = _data(rank, 24, torch.float32, 99).reshape(4, 6).t()
    expected = _expected(m.contiguous(), "sum")
    ring_all_reduce(m)
    out["shapes"].append(torch.equal(m, expected))
    # traces: every rank records what it sent
    for name, all_reduce in ALL_REDUCE.items():
        trace = []
        all_reduce(torch.ones(10), trace=trace)
        out["traces"][name] = trace
    # the ring's trace against its real traffic, plain and pipelined
    out["ring_runs"] = {(n, pieces): _ring_trace_and_traffic(n, pieces)
                        for n in RING_TRACE_LENGTHS for pieces in (1, 3)}
    return out


@pytest.fixture(scope="module", params=[1, 2, 3, pytest.param(4, marks=pytest.mark.slow)], ids=lambda w: f"W{w}")
def world_results(request):
    return request.param, dpteach.launch(_all_cases, request.param, timeout=240)


def test_every_all_reduce_equals_torchs_own(world_results):
    world, results = world_results
    for rank, res in enumerate(results):
        assert res["mismatch"] == [], f"rank {rank} of {world}: wrong result for {res['mismatch'][:5]}"


def test_reduce_scatter_then_all_gather_is_all_reduce(world_results):
    world, results = world_results
    for rank, res in enumerate(results):
        for n, chunk_ok, whole_ok, input_untouched in res["rs_ag"]:
            assert chunk_ok, f"rank {rank}: reduce-scatter chunk wrong for n={n}, W={world}"
            assert whole_ok, f"rank {rank}: all-gather of the chunks wrong for n={n}, W={world}"
            assert input_untouched, "ring_reduce_scatter must not modify its input"
        assert res["shapes"] == [True]


def test_ring_trace_delivers_every_chunk_to_every_rank(world_results):
    world, results = world_results
    sends = [t for res in results for t in res["traces"]["ring"]]
    # reduce-scatter: each rank sends W-1 chunks; all-gather: W-1 more
    assert len(sends) == 2 * world * (world - 1)
    for t in sends:
        assert t["dst"] == (t["src"] + 1) % world
    # replay the all-gather: start with rank r owning reduced chunk r, follow the transfers
    has = {r: {r} for r in range(world)}
    for step in range(world - 1):
        for t in (t for t in sends if t["phase"] == "all_gather" and t["step"] == step):
            assert t["chunk"] in has[t["src"]], "a rank forwarded a chunk it did not have yet"
            has[t["dst"]].add(t["chunk"])
    assert all(has[r] == set(range(world)) for r in range(world))
    # replay the reduce-scatter: chunk c must collect all W contributions on rank c
    contributions = {(r, c): {r} for r in range(world) for c in range(world)}
    for step in range(world - 1):
        for t in (t for t in sends if t["phase"] == "reduce_scatter" and t["step"] == step):
            contributions[(t["dst"], t["chunk"])] |= contributions[(t["src"], t["chunk"])]
    assert all(contributions[(c, c)] == set(range(world)) for c in range(world))
    # every chunk makes W-1 hops in each phase: 2(W-1) x n elements on the wire in all
    assert sum(t["elements"] for t in sends) == 2 * (world - 1) * 10


def test_ring_trace_is_what_was_sent_whether_or_not_pipelined(world_results):
    world, results = world_results
    keys = {"algorithm", "phase", "step", "src", "dst", "chunk", "start", "stop", "elements"}
    for rank, res in enumerate(results):
        for n in RING_TRACE_LENGTHS:
            (plain, plain_sent, plain_ok), (piped, piped_sent, piped_ok) = (res["ring_runs"][(n, p)] for p in (1, 3))
            assert plain_ok and piped_ok, f"rank {rank}: wrong all-reduce for n={n}, W={world}"
            # pieces change how a chunk travels, not the transfers: one record per step per phase, empty or not
            assert piped == plain
            assert [(t["phase"], t["step"], t["chunk"]) for t in plain] == [
                (phase, step, chunk) for phase in ("reduce_scatter", "all_gather")
                for step, chunk, _ in ring_schedule(rank, world, phase)]
            bounds = chunk_bounds(n, world)
            for t in plain:
                assert set(t) == keys and t["algorithm"] == "ring"
                assert (t["src"], t["dst"]) == (rank, (rank + 1) % world)
                assert (t["start"], t["stop"]) == bounds[t["chunk"]]
                assert t["elements"] == bounds[t["chunk"]][1] - bounds[t["chunk"]][0]
            # the trace names exactly the elements handed to the wire, in the order they went
            for trace, sent in ((plain, plain_sent), (piped, piped_sent)):
                assert [i for t in trace for i in range(t["start"], t["stop"])] == sent, (rank, n)


def test_tree_and_naive_traces_reach_every_rank(world_results):
    world, results = world_results
    for name in ("tree", "naive"):
        sends = [t for res in results for t in res["traces"][name]]
        reached = {0} | {t["dst"] for t in sends if t["phase"] == "broadcast"}
        assert reached == set(range(world))
        contributors = {0} | {t["src"] for t in sends if t["phase"] in ("reduce", "gather")}
        assert contributors == set(range(world))
        assert len(sends) == 2 * (world - 1)  # both trees and the star use W-1 edges each way


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
def test_ring_schedule_passes_each_chunk_on_so_rank_r_finishes_chunk_r(world):
    plan = {phase: {r: list(ring_schedule(r, world, phase)) for r in range(world)}
            for phase in ("reduce_scatter", "all_gather")}
    for phase, ranks in plan.items():
        for r, steps in ranks.items():
            sent, received = [c for _, c, _ in steps], [c for _, _, c in steps]
            assert [step for step, _, _ in steps] == list(range(world - 1))
            assert set(sent + received) <= set(range(world))
            assert len(set(sent)) == len(sent) and len(set(received)) == len(received), (phase, r)
            # the neighbours agree: what r receives at step s is what r-1 sends at step s
            assert received == [c for _, c, _ in ranks[(r - 1) % world]], (phase, r)
            # and each step passes on the chunk that arrived in the step before
            assert sent[1:] == received[:-1], (phase, r)
    # replay the reduce-scatter on the schedule alone: rank c ends with chunk c summed over all ranks
    holds = {(r, c): {r} for r in range(world) for c in range(world)}
    for step in range(world - 1):
        before = {key: set(v) for key, v in holds.items()}
        for r in range(world):
            _, chunk, _ = plan["reduce_scatter"][r][step]
            holds[((r + 1) % world, chunk)] |= before[(r, chunk)]
    for r in range(world):
        assert holds[(r, r)] == set(range(world))
        assert r not in [c for _, c, _ in plan["reduce_scatter"][r]]  # rank r never gives its chunk away
        # all-gather: rank r starts with the chunk it finished and receives every other chunk once
        assert [c for _, c, _ in plan["all_gather"][r]][:1] == ([r] if world > 1 else [])
        assert sorted(c for _, _, c in plan["all_gather"][r]) == [c for c in range(world) if c != r]


def test_ring_schedule_matches_the_worked_example_and_rejects_unknown_phases():
    assert doctest.testmod(ring).failed == 0  # the docstring's example: rank 0 of the 3-rank ring
    with pytest.raises(ValueError, match="phase='broadcast' is not allowed"):
        list(ring_schedule(0, 3, "broadcast"))


def _mismatched_lengths():
    x = torch.ones(5 + dist.get_rank())
    ring_all_reduce(x)


def _mismatched_dtypes():
    x = torch.ones(5, dtype=torch.float32 if dist.get_rank() == 0 else torch.float64)
    ALL_REDUCE["tree"](x)


@pytest.mark.slow  # more than 4 s on 2 cores: in `make test`, not `make test-fast`
@pytest.mark.parametrize("fn", [_mismatched_lengths, _mismatched_dtypes])
def test_mismatched_tensors_are_an_error_not_a_hang(fn):
    with pytest.raises(dpteach.RankError) as info:
        dpteach.launch(fn, 3, timeout=60)
    assert info.value.exc_type == "ValueError"
    assert "different tensors" in str(info.value) and "rank 0" in str(info.value)


def _bad_op():
    ring_all_reduce(torch.ones(3), op="max")


def test_bad_op_is_rejected_before_sending():
    with pytest.raises(dpteach.RankError, match="op='max' is not allowed"):
        dpteach.launch(_bad_op, 2, timeout=60)


def test_chunk_bounds_cover_everything_in_order():
    for n in range(0, 12):
        for parts in range(1, 6):
            bounds = chunk_bounds(n, parts)
            assert bounds[0][0] == 0 and bounds[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
            sizes = [stop - start for start, stop in bounds]
            assert max(sizes) - min(sizes) <= 1


def _cuda_cases():
    device = dpteach.device()
    out = []
    for name, all_reduce in ALL_REDUCE.items():
        x = torch.arange(10, dtype=torch.float32, device=device) + dist.get_rank()
        expected = x.clone()
        dist.all_reduce(expected)
        all_reduce(x)
        out.append((name, x.is_cuda, torch.equal(x, expected)))
    x = torch.arange(11, dtype=torch.float32, device=device) * (dist.get_rank() + 1)
    expected = x.clone()
    dist.all_reduce(expected)
    ring_all_reduce(x, pieces=3)  # pipelined: NCCL hangs unless each batch pairs a send with a receive
    out.append(("ring pieces=3", x.is_cuda, torch.equal(x, expected)))
    x = torch.arange(7, dtype=torch.int16, device=device) * (dist.get_rank() + 1)  # no such type in NCCL
    expected = x.to(torch.int64)
    dist.all_reduce(expected)
    ring_all_reduce(x)
    out.append(("ring int16", x.is_cuda, torch.equal(x.to(torch.int64), expected)))
    return out


def test_a_type_nccl_lacks_travels_as_its_own_bytes():
    """Point-to-point copies bytes: an int16 tensor goes over NCCL as a uint8 view of the same memory,
    so a receive writes straight into the caller's tensor and nothing is rounded or converted."""
    x = torch.arange(-3, 4, dtype=torch.int16) * 1000
    wire = on_the_wire(x, backend="nccl")
    assert wire.dtype == torch.uint8 and wire.numel() == 2 * x.numel()
    assert wire.data_ptr() == x.data_ptr()
    wire.copy_(on_the_wire(x.flip(0).contiguous(), backend="nccl"))  # what a receive does
    assert torch.equal(x, torch.arange(3, -4, -1, dtype=torch.int16) * 1000)
    for kept in (torch.float16, torch.int8, torch.int64):
        y = torch.zeros(3, dtype=kept)
        assert on_the_wire(y, backend="nccl") is y
    assert on_the_wire(x, backend="gloo") is x  # gloo moves any type
    with pytest.raises(ValueError, match="must be contiguous"):
        on_the_wire(torch.zeros(4, 4, dtype=torch.int16).t(), backend="nccl")


@pytest.mark.gpu
def test_collectives_on_cuda_tensors_under_gloo():
    # two gloo ranks computing on the one GPU: buffers are staged through host memory
    for rank_result in dpteach.launch(_cuda_cases, 2, backend="gloo", device="cuda"):
        assert all(is_cuda and ok for _, is_cuda, ok in rank_result), rank_result


@pytest.mark.multigpu
def test_collectives_with_nccl():
    for rank_result in dpteach.launch(_cuda_cases, 2, backend="nccl"):
        assert all(is_cuda and ok for _, is_cuda, ok in rank_result), rank_result


def _batches_of_the_pipelined_ring(n, pieces):
    """Record every batch the pipelined ring posts on this rank: (what it sends to, what it receives from)."""
    batches, real_post = [], ring.post

    def recording_post(send, dst, recv, src, group=None):
        batches.append((dst if send is not None and send.numel() else None,
                        src if recv is not None and recv.numel() else None))
        return real_post(send, dst, recv, src, group)

    ring.post = recording_post
    try:
        x = torch.arange(n, dtype=torch.float32) + dist.get_rank()
        ring_all_reduce(x, pieces=pieces)
    finally:
        ring.post = real_post
    return batches


@pytest.mark.slow  # more than 4 s on 2 cores: in `make test`, not `make test-fast`
@pytest.mark.parametrize("world, n, pieces", [(3, 30, 3), (4, 10, 4), (2, 5, 3)])
def test_pipelined_ring_pairs_each_send_with_its_receive_in_the_same_order_on_every_rank(world, n, pieces):
    # NCCL runs batched point-to-point calls one after another on one stream: the k-th batch of
    # every rank must meet the k-th batches of its neighbours, or the ring waits on itself forever.
    per_rank = dpteach.launch(_batches_of_the_pipelined_ring, world, args=(n, pieces))
    assert len({len(batches) for batches in per_rank}) == 1
    for rank, batches in enumerate(per_rank):
        right, left = (rank + 1) % world, (rank - 1) % world
        for k, (send_to, receive_from) in enumerate(batches):
            assert send_to in (right, None) and receive_from in (left, None)
            # what this rank sends in batch k, its right neighbour receives in its batch k
            assert (send_to is None) == (per_rank[right][k][1] is None), (rank, k)
