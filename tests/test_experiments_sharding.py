"""Lesson 11's experiments: measured memory against the ZeRO paper's accounting, the zero3 timeline,
and the payoff arithmetic against the paper's own example."""
import pytest

from dpteach.experiments import sharding_memory, sharding_payoff, sharding_timeline

CPU = {"backend": "gloo", "device": "cpu"}


@pytest.fixture(scope="module")
def memory():
    return sharding_memory(2, optimizer="adam", steps=3, **CPU)


@pytest.mark.slow  # more than 4 s on 2 cores: in `make test`, not `make test-fast`
def test_measured_state_is_what_the_paper_predicts_for_every_strategy(memory):
    assert [r["strategy"] for r in memory["rows"]] == ["ddp", "zero1", "zero2", "zero3", "fsdp"]
    for row in memory["rows"]:
        # the prediction has no padding and no Adam step counters: a fraction of a percent
        assert row["state_bytes"] == pytest.approx(row["predicted_state_bytes"], rel=0.005), row["strategy"]
        assert row["peak_bytes"] >= row["state_bytes"]
        assert row["max_abs_diff_vs_single"] <= memory["tolerance"] and row["replicas_identical"]


def test_activations_are_measured_once_for_a_ranks_micro_batch_and_no_strategy_shards_them(memory):
    from dpteach.replica.activations import activation_profile
    batch = memory["batch_per_rank"]
    profile = activation_profile(memory["model"], batch)  # lesson 15's measure, at the same micro-batch
    assert memory["activation_bytes"] == profile["saved_bytes"] > 0
    assert {row["activation_bytes"] for row in memory["rows"]} == {memory["activation_bytes"]}


def test_each_stage_holds_less_and_only_stage_3_sends_more(memory):
    rows = {r["strategy"]: r for r in memory["rows"]}
    held = [rows[s]["state_bytes"] for s in ("ddp", "zero1", "zero2", "zero3")]
    assert held == sorted(held, reverse=True) and len(set(held)) == 4
    assert rows["zero1"]["bytes_vs_ddp"] == pytest.approx(1.0, rel=0.01)
    assert rows["zero3"]["bytes_vs_ddp"] == pytest.approx(1.5, rel=0.01) == rows["fsdp"]["bytes_vs_ddp"]


@pytest.mark.slow  # more than 4 s on 2 cores: in `make test`, not `make test-fast`
def test_the_zero3_timeline_has_every_ranks_gathers_and_scatters():
    result = sharding_timeline(2, steps=2, **CPU)
    assert result["step"] == 1 and set(result["spans"]) == {0, 1}
    for rank, spans in result["spans"].items():
        names = {s["name"] for s in spans}
        assert {"forward", "backward", "all_gather", "reduce_scatter"} <= names
        assert result["gathers"][rank]["on_demand"] == 2 and result["gathers"][rank]["prefetched"] > 0
    with pytest.raises(ValueError, match="steps=1 is not allowed"):
        sharding_timeline(2, steps=1, **CPU)


@pytest.mark.slow  # more than 4 s on 2 cores: in `make test`, not `make test-fast`
def test_the_fsdp_timeline_reads_fsdp2s_own_collectives_from_the_profiler():
    """FSDP2 on CPU tensors: forward all-gathers issued by each layer (its forward prefetching needs CUDA
    streams), backward ones prefetched one layer ahead, one reduce-scatter per layer - all inside the step."""
    result = sharding_timeline(2, steps=2, strategy="fsdp", **CPU)
    assert result["strategy"] == "fsdp" and set(result["spans"]) == {0, 1}
    for rank, spans in result["spans"].items():
        gathers = [s for s in spans if s["name"] == "all_gather"]
        scatters = [s for s in spans if s["name"] == "reduce_scatter"]
        layers = {s["layer"] for s in gathers}
        assert len(layers) > 2 and {s["layer"] for s in scatters} == layers and len(scatters) == len(layers)
        assert result["gathers"][rank] == {"on_demand": len(layers) + 1, "prefetched": len(layers) - 1}
        assert sum(s["prefetched"] for s in gathers) == len(layers) - 1
        # the profiler's clock mapped onto the trainer's: every collective falls inside forward..backward
        start = min(s["start"] for s in spans if s["name"] == "forward")
        end = max(s["end"] for s in spans if s["name"] == "backward")
        assert all(start - 5e-3 <= s["start"] <= s["end"] <= end + 5e-3 for s in gathers + scatters)
    with pytest.raises(ValueError, match="strategy='zero2' is not allowed"):
        sharding_timeline(2, strategy="zero2", **CPU)


def test_payoff_reproduces_the_zero_papers_example():
    """Rajbhandari et al. 2020, Figure 1: 7.5B parameters, mixed-precision Adam, 64 GPUs."""
    result = sharding_payoff(7.5, world_sizes=(64,), gpu_gb=32, link="ib")
    by_stage = {r["stage"]: r for r in result["rows"]}
    assert [round(by_stage[s]["gb_per_gpu"], 1) for s in range(4)] == [120.0, 31.4, 16.6, 1.9]
    assert [by_stage[s]["fits"] for s in range(4)] == [False, True, True, True]
    assert by_stage[3]["comm_s"] == pytest.approx(1.5 * by_stage[0]["comm_s"])
    assert by_stage[1]["comm_s"] == by_stage[2]["comm_s"] == by_stage[0]["comm_s"]
    with pytest.raises(ValueError, match="link=None is not allowed"):
        sharding_payoff(link=None)


@pytest.mark.slow  # more than 4 s on 2 cores: in `make test`, not `make test-fast`
@pytest.mark.parametrize("strategy", ("zero3", "fsdp"))
def test_parameter_sharding_runs_the_transformer_exactly(strategy):
    """torch's MultiheadAttention reads out_proj's weight without calling out_proj, so zero3 gathers and FSDP2
    shards an attention block together with its output projection (sync/sharding.parameter_units): both
    train the transformer to single-process training's weights, and gather every unit in both passes."""
    from dpteach.experiments import compare_strategies
    from dpteach.sync.sharding import parameter_units
    from dpteach.replica.models import build_model
    result = compare_strategies(2, model="transformer", steps=3, batch_per_rank=4, optimizer="adam",
                                strategies=("ddp", strategy), **CPU)
    row = next(r for r in result["rows"] if r["strategy"] == strategy)
    assert row["max_abs_diff_vs_single"] <= result["tolerance"] and row["replicas_identical"]
    units = parameter_units(build_model("transformer"))
    assert any(isinstance(u, __import__("torch").nn.MultiheadAttention) for u in units)
    timeline = sharding_timeline(2, model="transformer", steps=2, strategy=strategy, **CPU)
    gathers = timeline["gathers"][0]
    assert gathers["prefetched"] + gathers["on_demand"] == 2 * len(units)
