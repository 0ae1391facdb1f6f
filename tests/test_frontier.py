"""Lesson 16's strategies on real gloo ranks, each held to what it claims: ZeRO++'s bytes per level (counted and
measured on the sockets) and hpZ's exactness against zero3; DeMo's step against a plain single-process DeMo with an
FFT-based DCT; streaming DiLoCo equal to DiLoCo when its three changes are off, and its peak exchange a fraction of
DiLoCo's; the distributed Muon step equal to torch's Muon; block quantisation within its bound."""
import math

import pytest
import torch

from dpteach.experiments.compare import compare_strategies, parse_variant
from dpteach.experiments.frontier import muon_against_torch, zeropp_levels
from dpteach.experiments.sending_less import frontier_methods
from dpteach.ranks.launcher import launch
from dpteach.sync.blockwise import dequantize_blocks, encoded_bytes, error_bound, quantize_blocks
from dpteach.sync.demo import dct_matrix
from dpteach.sync.muon import assign_owners
from dpteach.training.train import TrainConfig


@pytest.mark.parametrize("bits", [8, 4])
def test_block_quantisation_stays_within_half_a_step_and_packs_its_bytes(bits):
    x = torch.randn(1001) * torch.logspace(-3, 2, 1001)  # blocks of very different sizes: one scale each
    x[300:600] = 0.0  # an all-zero block comes back as zeros
    codes, scales = quantize_blocks(x, 128, bits)
    back = dequantize_blocks(codes, scales, x.numel(), 128, bits)
    assert back.shape == x.shape and torch.equal(back[384:512], torch.zeros(128))
    assert ((x - back).abs() <= error_bound(scales, 128, x.numel()) * (1 + 1e-6)).all()
    assert codes.numel() * codes.element_size() + scales.numel() * 4 == encoded_bytes(x.numel(), 128, bits)
    one_scale = x.abs().max() / {8: 127, 4: 7}[bits] / 2  # a single scale would drown the small blocks
    assert (x - back)[:100].abs().max() < one_scale / 100


def test_the_dct_matrix_is_orthonormal_and_equals_an_fft_dct():
    n = 12
    c = dct_matrix(n)
    assert torch.allclose(c @ c.T, torch.eye(n), atol=1e-6)
    x = torch.randn(n, dtype=torch.float64)
    # DCT-II by FFT (Makhoul 1980): reorder, FFT, twiddle - another road to the same numbers
    v = torch.cat([x[::2], x.flip(0)[::2]])
    k = torch.arange(n, dtype=torch.float64)
    y = (torch.fft.fft(v) * torch.exp(-1j * math.pi * k / (2 * n))).real * 2
    y[0] *= math.sqrt(1 / (4 * n))
    y[1:] *= math.sqrt(1 / (2 * n))
    assert torch.allclose(c.double() @ x, y, atol=1e-5)


def _demo_step_on_rank(seed):
    """One DeMo step on this rank's own gradient, and the plain reference of Algorithm 1 for every rank."""
    import torch.distributed as dist
    from dpteach.ranks import context
    from dpteach.replica.timeline import Timeline
    from dpteach.sync.demo import DeMo
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(12, 8), torch.nn.Linear(8, 4))  # every dimension in chunks of 4
    before = [p.detach().clone() for p in model.parameters()]
    grads = [[torch.randn(p.shape) for p in model.parameters()] for _ in range(world)]
    demo = DeMo(model, Timeline(context.device()), demo_chunk=4, demo_topk=3, demo_decay=0.9, demo_lr=0.01)
    optimizer = demo.make_optimizer(None)
    demo.start_step(0)
    for p, g in zip(model.parameters(), grads[rank]):
        p.grad = g.clone()
    demo.finish(0)
    optimizer.step()
    ours = [p.detach() - b for p, b in zip(model.parameters(), before)]
    # the reference: each rank's momentum is its gradient (first step); per chunk, DCT by matrix on each axis,
    # top-3 by magnitude, averaged over the ranks that picked a coefficient, inverse DCT, sign, step
    expected = []
    for i, p in enumerate(model.parameters()):
        shape = p.shape
        basis = [dct_matrix(4).double() for _ in shape]
        coefficient_sets = []
        for r in range(world):
            m = grads[r][i].double()
            if len(shape) == 2:
                blocks = m.reshape(shape[0] // 4, 4, shape[1] // 4, 4).permute(0, 2, 1, 3)
                coeff = (basis[0] @ blocks @ basis[1].T).reshape(-1, 16)
            else:
                coeff = m.reshape(-1, 4) @ basis[0].T
            coefficient_sets.append(coeff)
        sums = torch.zeros_like(coefficient_sets[0])
        counts = torch.zeros_like(coefficient_sets[0])
        for coeff in coefficient_sets:
            picks = coeff.abs().topk(3, dim=1).indices
            sums.scatter_add_(1, picks, coeff.gather(1, picks))
            counts.scatter_add_(1, picks, torch.ones_like(picks, dtype=torch.float64))
        mean = torch.where(counts > 0, sums / counts.clamp(min=1), torch.zeros_like(sums))
        if len(shape) == 2:
            blocks = mean.reshape(shape[0] // 4, shape[1] // 4, 4, 4)
            q = (basis[0].T @ blocks @ basis[1]).permute(0, 2, 1, 3).reshape(shape)
        else:
            q = (mean @ basis[0]).reshape(shape)
        expected.append((-0.01 * torch.sign(q).float(), q.abs().float()))
    demo.close()
    return [(o, e, small) for o, (e, small) in zip(ours, expected)]


@pytest.mark.parametrize("world_size", [2, 3])
def test_one_demo_step_equals_a_plain_single_process_demo(world_size):
    for per_rank in launch(_demo_step_on_rank, world_size, args=(0,), timeout=60):
        for ours, expected, magnitude in per_rank:
            clear = magnitude > 1e-6  # where the averaged component is not a rounding away from zero
            assert torch.allclose(ours[clear], expected[clear], atol=1e-6)  # w + step - w: rounding only
            assert clear.float().mean() > 0.95


def test_demo_sends_a_tenth_of_ddp_and_reaches_the_target():
    out = frontier_methods(2, methods=("ddp", "demo"), links=())
    rows = {r["method"]: r for r in out["rows"]}
    assert rows["demo"]["bytes_per_step"] <= rows["ddp"]["bytes_per_step"] / 10
    assert rows["demo"]["steps_to_target"] is not None
    # an all-gather of W = 2: each rank sends its own pairs once, exactly what the accounting predicts
    assert rows["demo"]["bytes_per_step"] == rows["demo"]["expected_pairs_bytes"]


@pytest.mark.slow  # 3 trainings side by side on 2 ranks
def test_streaming_diloco_with_its_changes_off_is_diloco_and_its_peak_is_a_quarter():
    off = "streaming_diloco(fragments=1,overlap_steps=0,outer_bits=32,mix=0.0)"
    out = compare_strategies(2, model="mlp", steps=16, strategies=["diloco", off, "streaming_diloco"],
                             interleave=True)
    runs = out["runs"]
    assert torch.equal(runs["diloco"][0]["params"], runs[off][0]["params"])
    peak = {name: max(max(r["wire_bytes"]) for r in runs[name]) for name in ("diloco", "streaming_diloco")}
    assert peak["streaming_diloco"] <= peak["diloco"] / 4


@pytest.mark.parametrize("world_size", [2, 3])
def test_the_distributed_muon_step_equals_torch_muon_on_the_same_gradients(world_size):
    out = muon_against_torch(world_size)
    assert out["equal"] and out["max_abs_diff"] <= out["tolerance"]
    assert all(r["moved"] > 0 for r in out["ranks"])  # the step did change the weights
    owned = sorted(i for r in out["ranks"] for i in r["owned"])
    assert owned == list(range(len(owned)))  # every parameter has exactly one owner
    total = sum(r["momentum_elements"] for r in out["ranks"])
    assert all(r["momentum_elements"] < total for r in out["ranks"])  # no rank keeps every matrix's momentum


def test_owners_are_whole_matrices_balanced_largest_first():
    assert assign_owners([10, 100, 100, 1], 2) == [0, 0, 1, 1]
    assert assign_owners([5], 3) == [0]


@pytest.mark.slow  # zero3 and three ZeRO++ variants on 4 ranks
def test_zeropp_sends_a_third_of_zero3_across_nodes_counted_as_measured_and_hpz_alone_is_exact():
    out = zeropp_levels(4, link="pcie/1gbe", ranks_per_node=2, steps=4,
                        variants=("hpZ only", "ZeRO++ (all three)"))
    rows = {r["variant"]: r for r in out["rows"]}
    whole = rows["ZeRO++ (all three)"]
    assert whole["between_vs_zero3"] <= 0.35
    assert abs(whole["measured_vs_counted"] - 1) <= 0.05
    assert rows["hpZ only"]["max_abs_diff_vs_zero3"] <= out["tolerance"]
    assert rows["hpZ only"]["bytes_between_per_step"] < rows["zero3"]["bytes_between_per_step"]
    for part in ("qwz", "qgz"):
        noted = whole["quantisation"][part]
        assert 0 < noted["max_error"] and noted["of_bound"] <= 1 + 1e-4


@pytest.mark.parametrize("spec, fragment", [
    ("zeropp(qgz_bits=5)", "qgz_bits=5"),
    ("zeropp(speed=1)", "'speed'"),
    ("streaming_diloco(fragments=16)", "fragments=16"),
    ("streaming_diloco(overlap_steps=4)", "overlap_steps=4"),
    ("muon", "optimizer='sgd'"),
])
def test_bad_settings_are_refused_before_any_rank_starts(spec, fragment):
    from dpteach.experiments.compare import strategy_config
    from dpteach.ranks.world import resolve_world
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(")):
        name, knobs = parse_variant(spec)
        strategy_config(TrainConfig(), spec).check(resolve_world(4, "gloo", "cpu"))


def test_the_command_line_keeps_a_variant_s_commas_inside_its_parentheses():
    from dpteach.commands.compare import split_strategies
    assert split_strategies("zero3, zeropp(qwz=False,qgz=False),hsdp,") == ["zero3", "zeropp(qwz=False,qgz=False)",
                                                                            "hsdp"]
    assert parse_variant("zeropp(qwz=False,qgz=False)") == ("zeropp", {"qwz": False, "qgz": False})
