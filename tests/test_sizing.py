"""``model="auto"``: the laptop model on CPU ranks; on GPU ranks the largest GPU-sized one that fits the GPU
and the panel's time budget, with the reason said. The GPU's measurements are given here (a machine
without a GPU cannot take them); the decisions are the code's."""
import pytest

from dpteach.replica import sizing
from dpteach.ranks.backend import Placement
from dpteach.network import PRESETS
from dpteach.replica.models import SPECS, parameter_count
from dpteach.replica.sizing import GpuCapacity, RunLoad, choose_model
from dpteach.ranks.world import World

CPU_WORLD = World(2, Placement("gloo", "cpu", 0))
GPU_WORLD = World(2, Placement("nccl", "cuda", 2))
H200 = GpuCapacity("H200", 140 * 2**30, 141 * 2**30, 50.0)
SMALL = GpuCapacity("a 16 GiB GPU", 15 * 2**30, 16 * 2**30, 15.0)


@pytest.fixture
def gpu(monkeypatch):
    def use(capacity):
        monkeypatch.setattr(sizing, "measure_gpu", lambda index=0: capacity)
    return use


def test_cpu_ranks_keep_the_lessons_laptop_model_and_batch():
    choice = choose_model("auto", CPU_WORLD, RunLoad(steps=100, cpu_model="transformer", batch_per_rank=64))
    assert (choice.name, choice.batch_per_rank, choice.params) == ("transformer", 64, parameter_count("transformer"))
    assert "CPU" in choice.reason and choice.asked == "auto"


def test_a_model_asked_for_is_used_as_given_with_its_own_batch(gpu):
    gpu(H200)
    choice = choose_model("transformer-25m", GPU_WORLD, RunLoad(steps=10))
    assert (choice.name, choice.batch_per_rank, choice.reason) == ("transformer-25m", 16, "the model asked for")
    assert choose_model("cnn", GPU_WORLD, RunLoad(steps=10, batch_per_rank=24)).batch_per_rank == 24


def test_the_largest_model_that_fits_the_time_budget_is_chosen(gpu):
    gpu(H200)
    quick = choose_model("auto", GPU_WORLD, RunLoad(steps=20))
    assert quick.name == "transformer-350m" and quick.predicted_step_s is not None
    longer = choose_model("auto", GPU_WORLD, RunLoad(steps=90))  # 90 steps of 350m would take over 30 s
    assert longer.name == "transformer-110m"
    assert "transformer-350m would take about" in longer.reason and "H200" in longer.reason
    assert sizing.STARTUP_S + 90 * longer.predicted_step_s <= sizing.PANEL_BUDGET_S


def test_memory_and_ranks_sharing_a_gpu_shrink_the_choice(gpu):
    gpu(SMALL)
    alone = choose_model("auto", GPU_WORLD, RunLoad(steps=10, models_at_once=1))
    many = choose_model("auto", GPU_WORLD, RunLoad(steps=10, models_at_once=10))
    assert parameter_count(many.name) < parameter_count(alone.name)
    assert "GiB per rank" in many.reason
    shared = World(4, Placement("gloo", "cuda", 1))  # four ranks take turns on one GPU
    assert parameter_count(choose_model("auto", shared, RunLoad(steps=10)).name) <= parameter_count(alone.name)


def test_an_emulated_links_time_counts_and_nothing_fitting_falls_back_to_the_tiny_transformer(gpu):
    gpu(H200)
    fast = choose_model("auto", GPU_WORLD, RunLoad(steps=40, link=PRESETS["ib"]))
    slow = choose_model("auto", GPU_WORLD, RunLoad(steps=40, link=PRESETS["1gbe"]))
    assert SPECS[fast.name].sized_for == "gpu"
    assert slow.name == "transformer" and "no GPU-sized model fits" in slow.reason


def test_bad_model_names_are_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"model='resnet' is not allowed: choose one of auto, mlp, cnn, transformer"):
        choose_model("resnet", CPU_WORLD, RunLoad(steps=1))


def test_estimates_follow_the_models_arithmetic():
    """FLOPs grow with the weights and tokens; memory with every model held at once."""
    assert sizing.step_flops("transformer-110m", 8) > 2 * sizing.step_flops("transformer-110m", 4) * 0.99
    assert sizing.step_flops("transformer-350m", 4) > sizing.step_flops("transformer-110m", 4)
    one = sizing.bytes_per_rank("transformer-110m", 8, RunLoad(steps=1))
    two = sizing.bytes_per_rank("transformer-110m", 8, RunLoad(steps=1, models_at_once=2))
    assert two - one == 4 * parameter_count("transformer-110m") * 4  # weights, grads, bucket copy, momentum


def test_every_panel_says_which_model_ran_and_why():
    from dpteach.replica.sizing import ModelChoice
    from dpteach.widgets.panel import run_notes
    choice = ModelChoice("transformer-110m", parameter_count("transformer-110m"), 8, "the largest that fits")
    notes = run_notes({"model_choice": choice.as_dict(), "peers_note": "1 GPU + 7 emulated peers: timings emulate W=8",
                       "model": "transformer-110m"})
    assert notes[0] == "Model: model transformer-110m (111.0 M parameters, batch 8 per rank): the largest that fits."
    assert notes[1] == "Peers: 1 GPU + 7 emulated peers: timings emulate W=8."
    fixed = run_notes({"model": "cnn", "world_size": 2})
    assert fixed and fixed[0].startswith("Model: cnn (0.6 M parameters), as the panel asked")
    unasked = run_notes({"model": "cnn", "world_size": 2}, model_chosen=False)  # a panel without a model control
    assert "as the panel asked" not in unasked[0] and unasked[0].startswith("Model: cnn (0.6 M parameters), the lesson's")
    assert run_notes({"sizes": [1, 2]}) == [] and run_notes(None) == []
