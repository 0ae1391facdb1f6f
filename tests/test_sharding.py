"""ZeRO stages 1-3 and torch's FSDP2 on real gloo worlds: the weights of single-process training,
and the memory and traffic the ZeRO paper says each stage trades (Rajbhandari et al., SC 2020)."""
from dataclasses import replace

import pytest

import dpteach
from dpteach.replica.models import build_model
from dpteach.training.reference import SGD_TOLERANCE, exact_tolerance, train_single_process
from dpteach.sync import SHARDED  # zero1, zero2, zero3, fsdp
from dpteach.training.train import TrainConfig, train_each_on_rank

STEPS = 4


def _configs():
    base = TrainConfig(steps=STEPS, batch_per_rank=8, timing_warmup=0)
    return [replace(base, strategy="ddp", optimizer=o) for o in ("sgd", "adam")] + \
           [replace(base, strategy=s, optimizer=o, accum_steps=k) for s in SHARDED for o in ("sgd", "adam")
            for k in (1, 2)] + \
           [replace(base, strategy=s, all_reduce="ring", accum_steps=2) for s in SHARDED[:3]]  # lesson 02's ring


@pytest.fixture(scope="module", params=[2, pytest.param(3, marks=pytest.mark.slow),
                                        pytest.param(4, marks=pytest.mark.slow)], ids=lambda w: f"W{w}")
def runs(request):
    world, configs = request.param, _configs()
    return world, configs, dpteach.launch(train_each_on_rank, world, args=(configs,), timeout=600, show_output=False)


def test_every_stage_ends_at_the_weights_of_one_process(runs):
    world, configs, per_rank = runs
    references = {}
    for i, config in enumerate(configs):
        key = (config.optimizer, config.accum_steps)
        references.setdefault(key, train_single_process(config, world))
        deltas = (per_rank[0][i]["params"] - references[key]["params"]).abs()
        label = f"{config.strategy} ({config.all_reduce}), {config.optimizer}, K={config.accum_steps}, W={world}"
        assert deltas.max() <= exact_tolerance(config), f"{label}: max |dtheta| = {deltas.max():.3g}"
        assert (deltas > SGD_TOLERANCE).float().mean() < 1e-3, label
        assert all(per_rank[r][i]["replica_spread"] == 0.0 for r in range(world)), f"{label}: replicas differ"


def _by(configs, per_rank, strategy, optimizer="adam", accum=1, all_reduce="builtin"):
    i = next(j for j, c in enumerate(configs)
             if (c.strategy, c.optimizer, c.accum_steps, c.all_reduce) == (strategy, optimizer, accum, all_reduce))
    return [rank[i] for rank in per_rank]


def test_each_stage_holds_what_the_zero_paper_says(runs):
    """With fp32 Adam a DDP rank holds parameters, gradients and two moments: 4 x Psi floats. Stage 1
    keeps the moments of its shard only (2 + 2/W), stage 2 also only its gradient shard (1 + 3/W),
    stage 3 and FSDP only shards of everything (4/W). Padding to a multiple of W adds a few bytes."""
    world, configs, per_rank = runs
    psi = sum(p.numel() for p in build_model("mlp").parameters()) * 4
    ddp = max(r["state_bytes"] for r in _by(configs, per_rank, "ddp"))
    assert ddp == pytest.approx(4 * psi, abs=1024)  # params, grads, exp_avg, exp_avg_sq, and Adam's step counts
    expected = {"zero1": 2 + 2 / world, "zero2": 1 + 3 / world, "zero3": 4 / world, "fsdp": 4 / world}
    for strategy, factor in expected.items():
        held = max(r["state_bytes"] for r in _by(configs, per_rank, strategy))
        assert held / psi == pytest.approx(factor, rel=0.01, abs=0.001), strategy
        assert max(r["peak_bytes"] for r in _by(configs, per_rank, strategy)) >= held


def test_stages_1_and_2_send_what_ddp_sends_and_stage_3_half_as_much_again(runs):
    world, configs, per_rank = runs
    sent = {s: _by(configs, per_rank, s)[0]["wire_bytes_per_step"] for s in ("ddp", *SHARDED)}
    assert sent["zero1"] == pytest.approx(sent["ddp"], rel=0.01) and sent["zero2"] == pytest.approx(sent["ddp"], rel=0.01)
    assert SHARDED[:4] == ("zero1", "zero2", "zero3", "fsdp")  # then the hybrid ones, hsdp and hsdp_torch
    assert sent["zero3"] == pytest.approx(1.5 * sent["ddp"], rel=0.01) and sent["fsdp"] == pytest.approx(sent["zero3"], rel=0.01)
    # accumulating K=2 micro-batches: stage 3 gathers the parameters again for every micro-batch
    k2 = _by(configs, per_rank, "zero3", accum=2)[0]["wire_bytes_per_step"]
    assert k2 == pytest.approx(2.5 * sent["ddp"], rel=0.01)
    # on the course's ring the bytes are the same: the ring is what the padded equal chunks need
    ring = _by(configs, per_rank, "zero1", optimizer="sgd", accum=2, all_reduce="ring")[0]["wire_bytes_per_step"]
    assert ring == pytest.approx(sent["zero1"], rel=0.01)


def test_zero3_prefetches_every_all_gather_but_the_first_of_each_pass(runs):
    """After the first step has shown the order, every layer's all-gather is launched while the layer
    before it computes, except the first layer of forward and the first of backward; the timeline
    holds one all-gather span per layer and pass, and one reduce-scatter per layer."""
    world, configs, per_rank = runs
    layers = sum(1 for m in build_model("mlp").modules() if list(m.parameters(recurse=False)))
    for rank in _by(configs, per_rank, "zero3", optimizer="sgd"):
        assert rank["notes"] == {"prefetched": 2 * layers - 2, "on_demand": 2}
        last = [s for s in rank["spans"] if s["step"] == STEPS - 1]
        assert sum(s["name"] == "all_gather" for s in last) == 2 * layers
        assert sum(s["name"] == "reduce_scatter" for s in last) == layers
        assert all(s["end"] >= s["start"] for s in last)


def test_only_the_ring_takes_the_place_of_a_sharded_strategys_collectives():
    with pytest.raises(ValueError, match="all_reduce='tree' is not allowed with strategy='zero2'"):
        TrainConfig(strategy="zero2", all_reduce="tree").check(2)
    with pytest.raises(ValueError, match="all_reduce='ring' is not allowed with strategy='fsdp'"):
        TrainConfig(strategy="fsdp", all_reduce="ring").check(2)


@pytest.mark.parametrize("name, gb", [("ddp", 120.0), ("zero1", 31.4), ("zero2", 16.6), ("zero3", 1.9), ("fsdp", 1.9)])
def test_each_strategy_holds_what_the_zero_paper_figure_1_says(name, gb):
    # Rajbhandari et al., Figure 1: 7.5 B parameters, mixed-precision Adam (2 + 2 + 12 bytes), 64 ranks. The
    # fp16 parameters are 2 bytes each, so the 12 bytes of optimizer state are 6 per parameter byte.
    from dpteach.sync import strategy_class
    held = strategy_class(name).held_bytes_per_rank(param_bytes=2 * 7.5e9, state_per_param=6, world_size=64)
    assert round(held / 1e9, 1) == gb


def test_every_strategy_describes_itself():
    from dpteach.sync import STRATEGIES
    for name, cls in STRATEGIES.items():
        assert cls.name == name and cls.title() and cls.codec in ("fp32", "fp16", "bf16", "int8"), name
        assert cls.colour.startswith("#") and len(cls.colour) == 7, name
    assert {STRATEGIES[n].codec for n in ("int8", "int8_ef", "fp16", "bf16")} == {"int8", "fp16", "bf16"}
    assert STRATEGIES["int8_ef"].error_feedback and not STRATEGIES["int8"].error_feedback
