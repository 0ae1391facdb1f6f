"""Which backend and device every entry point chooses on machines with 0, 1, 2, 4 and 8 GPUs.

This machine need not have any GPU: the tests make torch report ``gpus`` CUDA devices and an NCCL
build (the three functions every placement decision reads), then call the real entry points. The
launcher's process start is replaced by a recorder that keeps the world it was asked for and stops
there, so nothing tries to start CUDA ranks; everything before it - argument checks, world
resolution, the experiment's own set-up - runs as it would on that machine.
"""
import json
import os
import threading

import cloudpickle
import pytest
import torch
import torch.distributed as dist

import dpteach
import dpteach.ranks.launcher
import dpteach.replica.sizing
import dpteach.ranks.world
from dpteach import course
from dpteach import experiments as ex
from dpteach.ranks.backend import Placement, choose_placement, cores_available, visible_gpus
from dpteach.experiments.bench import allreduce_benchmark
from dpteach.ranks.world import World, default_world_size, resolve_world
from dpteach.ranks.torchrun import agree_on_placement, check_joined_world, decide_placement, propose_placement
from dpteach.replica.models import SPECS
from dpteach.replica.sizing import GpuCapacity
from dpteach.training.train import TrainConfig

GPU_COUNTS = (0, 1, 2, 4, 8)


class Recorded(Exception):
    """Raised by the stand-in for the process start, carrying what launch() was about to start."""

    def __init__(self, world_size, placement, env, payload=None, emulated_size=None):
        super().__init__(f"{world_size} ranks on {placement}")
        self.world_size, self.placement, self.env, self.emulated_size = world_size, placement, env, emulated_size
        self.payload = payload

    def configs(self) -> list:
        """Every TrainConfig the ranks were about to train, found in the function's arguments."""
        fn, args, kwargs = cloudpickle.loads(self.payload)
        found, todo = [], [*args, *kwargs.values()]
        while todo:
            item = todo.pop()
            if isinstance(item, TrainConfig):
                found.append(item)
            elif isinstance(item, (list, tuple)):
                todo.extend(item)
            elif isinstance(item, dict):
                todo.extend(item.values())
        return found


class RecordingRanks:
    def __init__(self, world, payload, timeout, show_output, progress, env):
        self.world_size, self.placement, self.env, self.payload = world.size, world.placement, env, payload
        self.emulated_size = world.emulated_size

    def run(self):
        raise Recorded(self.world_size, self.placement, self.env, self.payload, self.emulated_size)


# What dpteach.replica.sizing measures of a GPU, here given for an H200 (141 GiB; its fp32 matmul rate, TF32 off, is
# about 50 TFLOP/s): the model choice is the code's, its inputs are the machine's.
H200 = GpuCapacity("NVIDIA H200 (simulated)", 140 * 2**30, 141 * 2**30, 50.0)


@pytest.fixture
def machine(monkeypatch):
    """``machine(gpus)`` makes torch report that many GPUs (and NCCL), each like an H200 to ``dpteach.replica.sizing``;
    launches are recorded, not started."""
    monkeypatch.delenv("DPTEACH_GPUS", raising=False)
    monkeypatch.setattr(dpteach.ranks.launcher, "RankProcesses", RecordingRanks)
    monkeypatch.setattr(dpteach.ranks.launcher, "check_memory_for_ranks", lambda world_size: None)
    monkeypatch.setattr(dpteach.replica.sizing, "measure_gpu", lambda index=0: H200)

    def simulate(gpus):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
        monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
        return gpus
    return simulate


def expected(gpus: int, world_size: int) -> tuple[str, str]:
    """The course's rule: NCCL when every rank has its own GPU, else gloo on the GPUs if any, else CPU."""
    if gpus >= world_size:
        return "nccl", "cuda"
    return "gloo", "cuda" if gpus else "cpu"


def recorded(call) -> Recorded:
    with pytest.raises(Recorded) as info:
        call()
    return info.value


@pytest.mark.parametrize("gpus", GPU_COUNTS)
@pytest.mark.parametrize("world_size", (1, 2, 3, 4, 8))
def test_the_placement_rule(machine, gpus, world_size):
    machine(gpus)
    placement = choose_placement(world_size)
    assert (placement.backend, placement.device_type) == expected(gpus, world_size)
    assert choose_placement(world_size, device="cpu") == Placement("gloo", "cpu", gpus)
    if gpus < world_size:
        with pytest.raises(ValueError, match="backend='nccl'"):
            choose_placement(world_size, backend="nccl")
    # ranks take turns on a device when there are more of them than devices
    devices = gpus if placement.device_type == "cuda" else cores_available()
    assert placement.oversubscribed(world_size) == (world_size > devices)


@pytest.mark.parametrize("gpus", GPU_COUNTS)
def test_launch_starts_the_world_the_rule_chooses_with_a_device_per_rank(machine, gpus):
    machine(gpus)
    for world_size in (1, 2, 4, 8):
        world = recorded(lambda: dpteach.launch(abs, world_size))
        assert world.world_size == world_size
        assert (world.placement.backend, world.placement.device_type) == expected(gpus, world_size)
        devices = [world.placement.device_for(r) for r in range(world_size)]
        if world.placement.backend == "nccl":
            assert devices == [f"cuda:{r}" for r in range(world_size)]  # one GPU each, never shared
            assert world.placement.process_group_backend == "cpu:gloo,cuda:nccl"
        elif gpus:
            assert devices == [f"cuda:{r % gpus}" for r in range(world_size)]
        else:
            assert devices == ["cpu"] * world_size


@pytest.mark.parametrize("gpus, world", [(0, None), (1, None), (2, 2), (4, 4), (8, 4)])
def test_the_default_world_follows_the_gpus(machine, gpus, world):
    machine(gpus)
    assert default_world_size() == (world if gpus >= 2 else max(2, min(4, os.cpu_count())))


# Every experiment of the course table that starts ranks (the rest: no ranks, one process, or torchrun's worlds)
NO_RANKS = {"memory_per_replica", "measure_model_memory", "bucket_assignment", "scaling_simulation",
            "sharding_payoff", "checkpoint_interval", "activation_memory", "checkpointing",
            "scaling_sweep",  # its own test
            "fault_detection", "restart_run", "replica_groups", "planted_job"}
SHORT_CALLS = {  # where a call with world_size W alone would not be short, or W is not its first argument
    "compare_strategies": lambda w: ex.compare_strategies(w, steps=2),
    "run_strategy": lambda w: ex.run_strategy(w, TrainConfig(strategy="naive", steps=2)),
    "bitwise_reproducibility": lambda w: ex.bitwise_reproducibility(w, steps=2),
    "ddp_bucket_assignment": lambda w: ex.ddp_bucket_assignment(world_size=w),
    "compression_bytes": lambda w: ex.compression_bytes(world_sizes=(w,)),
    "precision_drift": lambda w: ex.precision_drift(w, steps=2),
    "loss_scaling": lambda w: ex.loss_scaling(w, steps=2),
    "comm_precision": lambda w: ex.comm_precision(w, steps=2),
    "resume_equivalence": lambda w: ex.resume_equivalence(strategy="ddp", world_size=w),
    "checkpoint_cost": lambda w: ex.checkpoint_cost(strategies=("ddp",), world_size=w),
    "methods_to_target": lambda w: ex.methods_to_target(w, methods=("ddp", "local_sgd@4"), steps=8),
    "time_to_target": lambda w: ex.time_to_target(
        {"world_size": w, "optimizer": "sgd", "seed": 0, "bucket_mb": 25.0, "batch_per_rank": 32, "powersgd_start": 2,
         "knobs": {}, "steps": 8, "rows": [{"method": "ddp", "steps_to_target": None}]}, links=("1gbe",)),
    "outer_step": lambda w: ex.outer_step(world_size=w, steps=8),
    "powersgd_against_torch": lambda w: ex.powersgd_against_torch(world_size=w),
    "hybrid_sharding": lambda w: ex.hybrid_sharding(world_size=w, ranks_per_node=getattr(w, "size", w) // 2),
    "lr_rules": lambda w: ex.lr_rules(batches=(64,), world_size=w, max_steps=8),
    "critical_batch": lambda w: ex.critical_batch(batches=(32, 64), world_size=w, max_steps=8),
    "frontier_methods": lambda w: ex.frontier_methods(w, methods=("ddp", "demo"), steps=8, links=()),
    "frontier_time_to_target": lambda w: ex.frontier_time_to_target(
        {"world_size": w, "optimizer": "sgd", "seed": 0, "bucket_mb": 25.0, "batch_per_rank": 32, "powersgd_start": 2,
         "knobs": {}, "steps": 8, "rows": [{"method": "ddp", "steps_to_target": None}]}, links=("1gbe",)),
    "zeropp_levels": lambda w: ex.zeropp_levels(world_size=w, ranks_per_node=getattr(w, "size", w) // 2, steps=2,
                                                variants=("ZeRO++ (all three)",)),
    "time_to_target_scaling": lambda w: ex.time_to_target_scaling(
        {"model": "mlp", "scaling": "weak", "rows": [{"world_size": 1, "batch_per_rank": 32}]}, world_size=w),
}
EXTRA_CALLS = {  # launches the course table does not list by name: the bench, and a second strategy
    "bench": lambda w: allreduce_benchmark(w, ("4KiB",)),
    "sharding_timeline, fsdp": lambda w: ex.sharding_timeline(w, strategy="fsdp"),
}
EXPERIMENTS = {**{name: SHORT_CALLS.get(name, lambda w, name=name: getattr(ex, name)(w))
                  for name in sorted(course.experiment_homes()) if name not in NO_RANKS}, **EXTRA_CALLS}


def test_the_short_calls_name_experiments_of_the_course_that_start_ranks():
    assert set(SHORT_CALLS) <= set(course.experiment_homes()) - NO_RANKS
    assert NO_RANKS <= set(course.experiment_homes())


@pytest.mark.parametrize("gpus", GPU_COUNTS)
@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_each_experiment_and_bench_launch_where_the_rule_says(machine, gpus, name):
    machine(gpus)
    for world_size in (3, 4) if name == "async_staleness" else (2, 4):
        world = recorded(lambda: EXPERIMENTS[name](world_size))
        assert world.world_size == world_size
        assert (world.placement.backend, world.placement.device_type) == expected(gpus, world_size), name


# The experiments whose model is "auto" by default: the lessons that time training (03-06, 09, 11, 12).
AUTO_MODEL = ("compare_strategies", "bucket_size_sweep", "overlap_timeline", "accumulation_sweep",
              "compression_tradeoff", "compression_on_links", "sharding_memory", "sharding_timeline",
              "sharding_timeline, fsdp", "precision_drift", "loss_scaling", "comm_precision")


@pytest.mark.parametrize("gpus", (0, 1, 2, 8))
@pytest.mark.parametrize("name", AUTO_MODEL)
def test_lessons_train_a_gpu_sized_model_on_gpu_ranks_and_a_laptop_one_on_cpu_ranks(machine, gpus, name):
    """What the ranks were about to train, read from the payload they were sent: on CPU ranks the lesson's
    laptop model at its laptop batch; on GPU ranks (1, 2 or 8 of them) a model of the GPU-sized family,
    with DDP's 25 MiB buckets and the model's own per-rank batch."""
    machine(gpus)
    world_size = 2
    configs = recorded(lambda: EXPERIMENTS[name](world_size)).configs()
    assert configs, name
    for config in configs:
        spec = SPECS[config.model]
        if gpus:
            assert spec.sized_for == "gpu", (name, gpus, config.model)
            assert config.bucket_mb == 25.0 or name == "bucket_size_sweep", name  # the sweep sets its own
        else:
            assert spec.sized_for == "cpu" and config.batch_per_rank >= 8, (name, config.model)
    if gpus:  # (lesson 04's "halve the batch" candidate runs at half of it)
        assert max(c.batch_per_rank for c in configs) == SPECS[configs[0].model].batch_per_rank, name


@pytest.mark.parametrize("gpus", (1, 2, 8))
def test_the_command_line_and_a_scaling_sweep_choose_by_the_gpus_too(machine, gpus):
    machine(gpus)
    world = recorded(lambda: ex.scaling_sweep(world_sizes=(1, 2), steps=2))
    assert all(SPECS[c.model].sized_for == "gpu" for c in world.configs())
    from dpteach.cli import main
    assert SPECS[recorded(lambda: main(["compare", "-w", "2", "--steps", "2"])).configs()[0].model].sized_for == "gpu"


@pytest.mark.parametrize("gpus", GPU_COUNTS)
def test_a_scaling_sweep_uses_one_placement_for_every_world_size(machine, gpus):
    """Its first world (W=1) is started with the placement of its largest (W=4): a sweep never
    switches from NCCL to gloo half-way, and flags the worlds whose ranks share devices."""
    machine(gpus)
    world = recorded(lambda: ex.scaling_sweep(world_sizes=(1, 2, 4), steps=2))
    assert world.world_size == 1
    assert (world.placement.backend, world.placement.device_type) == expected(gpus, 4)
    if gpus:
        assert [world.placement.oversubscribed(w) for w in (1, 2, 4)] == [w > gpus for w in (1, 2, 4)]
        if gpus < 4:
            assert "time-slicing" in world.placement.describe_sharing(4)


@pytest.mark.parametrize("gpus, local_ranks", [(8, 8), (4, 8), (2, 2), (0, 4), (1, 1)])
def test_torchrun_worlds_choose_from_the_ranks_on_this_node(machine, monkeypatch, gpus, local_ranks):
    machine(gpus)
    monkeypatch.delenv("DPTEACH_PARENT_PID", raising=False)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", str(2 * local_ranks))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_ranks))
    world = resolve_world(None)
    world_size, placement = world.size, world.placement
    assert world_size == 2 * local_ranks
    assert (placement.backend, placement.device_type) == expected(gpus, local_ranks)
    assert propose_placement(local_ranks, "auto", "auto")["backend"] == expected(gpus, local_ranks)[0]
    if gpus < local_ranks:
        assert "error" in propose_placement(local_ranks, "nccl", "auto")


def node(host, gpus, local_ranks, backend):
    return {"host": host, "gpus": gpus, "local_ranks": local_ranks, "backend": backend,
            "device": "cuda" if gpus else "cpu"}


def test_ranks_that_disagree_all_fall_back_to_gloo_and_say_why():
    table = [node("a", 8, 8, "nccl")] * 8 + [node("b", 4, 8, "gloo")] * 8
    decision = decide_placement(table)
    assert decision["backend"] == "gloo"
    assert "b (4 GPU(s) for 8 ranks)" in decision["note"]
    assert decide_placement([node("a", 8, 8, "nccl")] * 8) == {"backend": "nccl"}
    assert decide_placement([node("a", 0, 2, "gloo")] * 2) == {"backend": "gloo"}


def test_a_rank_that_cannot_join_is_everyones_error():
    table = [node("a", 8, 8, "nccl")] * 3 + [{"host": "b", "local_ranks": 8, "error": "backend='nccl' ... 4 GPU(s)"}]
    with pytest.raises(ValueError, match=r"rank 3 on b cannot join this world: backend='nccl' \.\.\. 4 GPU\(s\)"):
        decide_placement(table)


def test_ranks_agree_through_a_real_store():
    """Four threads stand for four ranks on two nodes, one short of GPUs; each posts its proposal to a
    real TCPStore and reads everyone's: all four reach the same decision."""
    server = dist.TCPStore("127.0.0.1", 0, 5, True, wait_for_workers=False)
    proposals = [node("a", 2, 2, "nccl"), node("a", 2, 2, "nccl"), node("b", 1, 2, "gloo"), node("b", 1, 2, "gloo")]
    decisions = [None] * 4

    def rank(r):
        client = dist.TCPStore("127.0.0.1", server.port, 5, False)
        decisions[r] = agree_on_placement(dist.PrefixStore("t", client), r, 4, proposals[r])
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert decisions[0]["backend"] == "gloo" and all(d == decisions[0] for d in decisions)
    assert json.loads(server.get("t/2").decode())["host"] == "b"


def test_a_world_initialised_with_nccl_alone_gets_a_clear_error():
    with pytest.raises(ValueError, match=r"backend for CUDA tensors only \('cuda:nccl'\).*cpu:gloo,cuda:nccl"):
        check_joined_world("cuda:nccl", "auto", "auto", "cuda")
    check_joined_world("cpu:gloo,cuda:nccl", "auto", "auto", "cuda")  # the course's own NCCL world is fine
    with pytest.raises(ValueError, match="backend='gloo' differs .* with 'nccl'"):
        check_joined_world("cpu:gloo,cuda:nccl", "gloo", "auto", "cuda")
    with pytest.raises(ValueError, match="device='cpu' differs .* on 'cuda'"):
        check_joined_world("cpu:gloo,cuda:nccl", "auto", "cpu", "cuda")


def test_dpteach_gpus_caps_the_gpus_and_refuses_nonsense(machine, monkeypatch):
    machine(8)
    monkeypatch.setenv("DPTEACH_GPUS", "2")
    assert visible_gpus() == 2 and choose_placement(4).backend == "gloo"
    monkeypatch.setenv("DPTEACH_GPUS", "0")
    assert choose_placement(4) == Placement("gloo", "cpu", 0)
    monkeypatch.setenv("DPTEACH_GPUS", "many")
    with pytest.raises(ValueError, match="DPTEACH_GPUS='many' is not allowed"):
        visible_gpus()


def test_tests_not_marked_gpu_see_no_gpu():
    """What makes the rest of the suite machine-independent (the root conftest.py)."""
    assert os.environ["DPTEACH_GPUS"] == "0" and os.environ["CUDA_VISIBLE_DEVICES"] == ""
    assert visible_gpus() == 0


@pytest.mark.parametrize("gpus", (0, 1, 4))
def test_cublas_determinism_is_given_to_gpu_ranks_at_start_up_only(machine, gpus):
    """cuBLAS reads CUBLAS_WORKSPACE_CONFIG when a process first uses it, so GPU ranks get it in their
    start-up environment; CPU ranks, which have no cuBLAS, get nothing."""
    machine(gpus)
    world = recorded(lambda: ex.bitwise_reproducibility(2, steps=2))
    assert world.env == ({"CUBLAS_WORKSPACE_CONFIG": ":4096:8"} if gpus else {})


def test_deterministic_kernels_are_asked_for_on_a_gpu_and_the_setting_is_put_back():
    from dpteach.experiments.determinism import deterministic_kernels
    assert not torch.are_deterministic_algorithms_enabled()
    with deterministic_kernels(torch.device("cuda", 0)):  # sets a flag only; no CUDA call is made
        assert torch.are_deterministic_algorithms_enabled()
    assert not torch.are_deterministic_algorithms_enabled()
    with deterministic_kernels(torch.device("cpu")):
        assert not torch.are_deterministic_algorithms_enabled()


def test_the_reference_trains_on_the_ranks_kind_of_device_with_tf32_off_only_inside():
    from dpteach.ranks.backend import plain_fp32
    from dpteach.training.reference import reference_device
    assert reference_device(Placement("nccl", "cuda", 8)) == "cuda:0"
    assert reference_device(Placement("gloo", "cuda", 1)) == "cuda:0"
    assert reference_device(Placement("gloo", "cpu", 0)) == "cpu"
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    with plain_fp32("cuda:0"):  # flags only: no CUDA call is made
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.mark.parametrize("gpus, world_size, shares", [(1, 2, True), (1, 1, False), (2, 4, True), (4, 4, False)])
def test_a_panel_says_when_ranks_time_slice_a_gpu(machine, capsys, gpus, world_size, shares):
    from dpteach.widgets.panel import ExperimentPanel
    machine(gpus)
    backend = "nccl" if gpus >= world_size else "gloo"
    panel = ExperimentPanel("t", lambda: {"device": "cuda", "backend": backend, "world_size": world_size},
                            render=lambda result: None)
    panel.run()
    said = capsys.readouterr().out
    assert ("time-slicing" in said) == shares
    if shares:
        assert f"{world_size} ranks share {gpus} GPU(s)" in said


def test_exercise_try_cells_use_cpu_ranks_whatever_the_gpus():
    """On a one-GPU laptop W try-cell ranks would each open a CUDA context on the same GPU; they run on
    CPU with gloo, as the grader's checks do."""
    from pathlib import Path
    from dpteach.grading.notebook import read_notebook, tagged_cells
    from dpteach.grading.spec import all_exercises
    exercises = Path(__file__).resolve().parent.parent / "exercises"
    tries = {e.id: "\n".join(tagged_cells(read_notebook(exercises / e.notebook_name), "try")) for e in all_exercises()}
    launching = {key: code for key, code in tries.items() if "dpteach.launch(" in code}
    assert len(launching) >= 5
    for key, code in launching.items():
        assert 'backend="gloo", device="cpu"' in code, key


def test_nccl_ranks_share_a_gpu_only_when_asked_and_each_gets_a_host_id_of_its_own(machine, monkeypatch):
    machine(1)
    with pytest.raises(ValueError, match="NCCL needs one GPU per rank"):
        choose_placement(2, backend="nccl")
    assert choose_placement(2).backend == "gloo"  # never chosen by "auto"
    monkeypatch.setenv("DPTEACH_NCCL_SHARED_GPU", "1")
    placement = choose_placement(3, backend="nccl")
    assert placement == Placement("nccl", "cuda", 1, shared_gpu=True)
    assert placement.device_for(2) == "cuda:0" and placement.oversubscribed(3)
    envs = [placement.rank_env(r, "4242") for r in range(3)]
    assert len({e["NCCL_HOSTID"] for e in envs}) == 3
    assert all(e["NCCL_SOCKET_IFNAME"] == "lo" and e["NCCL_NET"] == "Socket" for e in envs)
    assert Placement("nccl", "cuda", 2).rank_env(0, "4242") == {}
    world = recorded(lambda: dpteach.launch(abs, 2, backend="nccl"))
    assert world.placement.shared_gpu


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_each_experiment_resolves_its_world_once_and_takes_one_resolved_before(machine, monkeypatch, name):
    """The world an experiment reports is the one its ranks ran in: resolved once, then passed on
    whole to launch; and a World resolved by the caller is used as it is, not resolved again."""
    machine(2)
    calls = []
    choose = dpteach.ranks.world.choose_placement
    monkeypatch.setattr(dpteach.ranks.world, "choose_placement", lambda *a, **k: calls.append(a) or choose(*a, **k))
    size = 3 if name == "async_staleness" else 2
    recorded(lambda: EXPERIMENTS[name](size))
    assert len(calls) == 1, f"{name} resolved its world {len(calls)} times"
    given = resolve_world(size, device="cpu")  # gloo on the CPU, although this machine has 2 GPUs
    calls.clear()
    started = recorded(lambda: EXPERIMENTS[name](given))
    assert calls == [] and started.placement == given.placement and started.world_size == size, name


def test_a_resolved_world_refuses_a_backend_or_device_it_does_not_have():
    world = World(2, Placement("gloo", "cpu", 0), ("auto", "auto"))
    assert resolve_world(world) is world and resolve_world(world, backend="gloo", device="cpu") is world
    with pytest.raises(ValueError, match=r"backend='nccl' is not allowed with a resolved world \(2 rank\(s\), gloo on cpu\)"):
        resolve_world(world, backend="nccl")
    with pytest.raises(ValueError, match="device='cuda' is not allowed"):
        dpteach.launch(abs, world, device="cuda")


@pytest.mark.parametrize("gpus", (0, 1, 2))
def test_the_lesson_controls_start_where_this_machine_shows_the_lesson(machine, gpus):
    """On one GPU the panels start on one rank with 7 emulated peers over InfiniBand (the regime of eight GPUs);
    with no GPU, on real ranks and the lesson's own link; the model dropdown offers the GPU-sized models only
    where there is a GPU, and starts on auto everywhere."""
    import ipywidgets as widgets
    from dpteach.replica.models import model_names
    from dpteach.widgets.controls import model_control, peers_control
    from dpteach.widgets.link import link_control
    machine(gpus)
    ranks = widgets.IntSlider(value=2, min=2, max=4)
    peers = peers_control(ranks, real_max=4)
    assert peers.value == ("emulated" if gpus == 1 else "real")
    assert (ranks.value, ranks.max) == ((8, 8) if gpus == 1 else (2, 4))
    peers.value = "emulated" if peers.value == "real" else "real"  # the learner switches: the slider follows
    assert ranks.max == (4 if gpus == 1 else 8) and ranks.value <= ranks.max
    assert link_control("1gbe").value == ("ib" if gpus else "1gbe")
    model = model_control("mlp")
    assert model.value == "auto" and [v for _, v in model.options][1:] == model_names(None if gpus else "cpu")
