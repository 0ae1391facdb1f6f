"""Data-parallel training on real gloo worlds, held to single-process training on the global batch."""
import json
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist

import dpteach
from dpteach.experiments.compare import compare_strategies
from dpteach.replica.models import build_model
from dpteach.sync import REPLICATED as EXACT  # the sharded ones: tests/test_sharding.py
from dpteach.training.reference import train_single_process
from dpteach.training.reference import SGD_TOLERANCE, exact_tolerance
from dpteach.training.train import TrainConfig, train_each_on_rank

STEPS = 4


def _configs():
    base = TrainConfig(steps=STEPS, batch_per_rank=8, timing_warmup=0)
    return [replace(base, strategy=s, accum_steps=k, optimizer=o)
            for o in ("sgd", "adam") for k in (1, 2) for s in EXACT] + \
           [replace(base, strategy="bucketed", all_reduce=a, accum_steps=k, optimizer=o)  # the course's own collectives
            for o in ("sgd", "adam") for k in (1, 2) for a in ("ring", "tree")] + \
           [replace(base, strategy="naive", all_reduce="ring")]


@pytest.fixture(scope="module", params=[2, pytest.param(3, marks=pytest.mark.slow)], ids=lambda w: f"W{w}")
def exact_runs(request):
    world = request.param
    configs = _configs()
    per_rank = dpteach.launch(train_each_on_rank, world, args=(configs,), timeout=600, show_output=False)
    return world, configs, per_rank


def test_exact_strategies_equal_single_process_training(exact_runs):
    world, configs, per_rank = exact_runs
    references = {}
    for i, config in enumerate(configs):
        key = (config.optimizer, config.accum_steps)
        if key not in references:
            references[key] = train_single_process(config, world)
        ref = references[key]
        rank0 = per_rank[0][i]
        deltas = (rank0["params"] - ref["params"]).abs()
        label = f"{config.strategy} ({config.all_reduce}), {config.optimizer}, K={config.accum_steps}, W={world}"
        tolerance = exact_tolerance(config)
        assert deltas.max() <= tolerance, f"{label}: max |dtheta| = {deltas.max():.3g} > {tolerance}"
        assert (deltas > SGD_TOLERANCE).float().mean() < 1e-3, f"{label}: too many weights differ"
        assert all(per_rank[r][i]["replica_spread"] == 0.0 for r in range(world)), f"{label}: replicas differ"
        assert rank0["losses"] == pytest.approx(ref["losses"], rel=1e-4, abs=1e-6), label
        # and the change is real: after training the weights have moved away from the start
        start = torch.nn.utils.parameters_to_vector(build_model(config.model, seed=config.seed).parameters())
        assert (rank0["params"] - start).abs().max() > 1e-3


def test_overlap_hooks_fire_once_per_parameter_per_backward(exact_runs):
    world, configs, per_rank = exact_runs
    n_params = len(list(build_model("mlp").parameters()))
    for i, config in enumerate(configs):
        if config.strategy == "overlap":
            expected = n_params * config.accum_steps * STEPS
            assert all(per_rank[r][i]["hook_calls"] == expected for r in range(world))


def test_accumulation_communicates_only_on_the_last_micro_batch(exact_runs):
    world, configs, per_rank = exact_runs
    bytes_by = {(c.strategy, c.optimizer, c.accum_steps): per_rank[0][i]["wire_bytes_per_step"]
                for i, c in enumerate(configs) if c.all_reduce == "builtin"}
    for strategy in EXACT:
        assert bytes_by[(strategy, "sgd", 2)] == bytes_by[(strategy, "sgd", 1)] > 0
    for i, config in enumerate(configs):  # one comm span per bucket per step, never per micro-batch
        if config.strategy in ("overlap", "ddp", "bucketed") and config.accum_steps == 2:
            spans = [s for s in per_rank[0][i]["spans"] if s["lane"] == "comm"]
            per_step = len(spans) / STEPS
            k1 = next(j for j, c in enumerate(configs) if (c.strategy, c.optimizer, c.all_reduce, c.accum_steps)
                      == (config.strategy, config.optimizer, config.all_reduce, 1))
            assert per_step == len([s for s in per_rank[0][k1]["spans"] if s["lane"] == "comm"]) / STEPS



def test_the_course_ring_sends_what_its_trace_shows_and_the_ring_formula_predicts(exact_runs):
    """With all_reduce='ring' the bytes are counted from the exchanges the ring made (its trace), not
    from a formula; averaged over the ranks they are the ring's 2(W-1)/W x n, which is what torch's
    all-reduce is charged. The tree sends otherwise: rank 0 sends more than a leaf does."""
    world, configs, per_rank = exact_runs
    def sent(strategy, all_reduce, rank=None):
        i = next(j for j, c in enumerate(configs) if (c.strategy, c.all_reduce, c.optimizer, c.accum_steps)
                 == (strategy, all_reduce, "sgd", 1))
        ranks = range(world) if rank is None else [rank]
        return sum(per_rank[r][i]["wire_bytes_per_step"] for r in ranks) / len(ranks)
    params = list(build_model("mlp").parameters())
    # the formula rounds each message's share down to whole bytes: at most one byte per tensor sent
    assert sent("bucketed", "ring") == pytest.approx(sent("bucketed", "builtin"), abs=len(params))
    assert sent("naive", "ring") == pytest.approx(sent("naive", "builtin"), abs=len(params))
    n = sum(p.numel() * 4 for p in params)
    assert sent("bucketed", "tree", rank=0) == pytest.approx(n * (world - 1).bit_length(), rel=1e-6)
    assert sent("bucketed", "tree", rank=world - 1) == pytest.approx(n, rel=1e-6)  # a leaf: up once

def _ddp_sync_decided_after_forward(correct: bool):
    """Count DDP's bucket all-reduces in one step of 2 micro-batches, deciding no_sync before or after forward."""
    from torch.nn.parallel import DistributedDataParallel
    model = DistributedDataParallel(torch.nn.Linear(8, 4))
    calls = []

    def counting_hook(state, bucket):
        calls.append(bucket.index())
        fut = torch.futures.Future()
        dist.all_reduce(bucket.buffer())
        fut.set_result(bucket.buffer())
        return fut
    model.register_comm_hook(None, counting_hook)
    x = torch.randn(3, 8)
    if correct:
        with model.no_sync():
            model(x).sum().backward()
    else:
        out = model(x)  # forward already armed the reducer...
        with model.no_sync():  # ...so entering no_sync now is too late
            out.sum().backward()
    model(x).sum().backward()
    return len(calls)


@pytest.mark.slow
def test_deciding_no_sync_after_forward_still_communicates():
    right, wrong = (dpteach.launch(_ddp_sync_decided_after_forward, 2, args=(c,))[0] for c in (True, False))
    assert wrong > right == 1


@pytest.mark.slow
def test_compressed_and_async_report_their_divergence_and_bytes():
    report = compare_strategies(3, steps=6, strategies=("local", "bucketed", "int8", "int8_ef", "fp16", "async"),
                                batch_per_rank=8)
    rows = {r["strategy"]: r for r in report["rows"]}
    assert rows["bucketed"]["max_abs_diff_vs_single"] <= SGD_TOLERANCE
    for name in ("int8", "int8_ef", "fp16"):
        assert rows[name]["replicas_identical"]  # every rank decodes the same gathered data
        assert 0 < rows[name]["max_abs_diff_vs_single"] < 0.1
        assert 0 < rows[name]["bytes_per_step"] < rows["bucketed"]["bytes_per_step"]
    assert rows["int8_ef"]["max_abs_diff_vs_single"] < rows["int8"]["max_abs_diff_vs_single"]
    assert rows["async"]["max_abs_diff_vs_single"] > 1e-3
    assert rows["local"]["bytes_per_step"] == 0 and not rows["local"]["replicas_identical"]


@pytest.mark.slow
def test_async_staleness_is_real_with_a_slow_worker_and_bounded_on_request():
    base = TrainConfig(strategy="async", steps=8, batch_per_rank=8, slow_rank=2, slow_ms=40)
    runs = dpteach.launch(train_each_on_rank, 3, args=([base, replace(base, knobs={"max_staleness": 0})],), timeout=300)
    free, bounded = runs[0][0]["async"], runs[0][1]["async"]
    stale = [s["staleness"] for s in free["staleness"]]
    assert max(stale) > 0 and free["dropped"] == 0 and free["applied"] == 16
    slow = [s["staleness"] for s in free["staleness"] if s["worker"] == 2]
    fast = [s["staleness"] for s in free["staleness"] if s["worker"] == 1]
    assert sum(slow) / len(slow) > sum(fast) / len(fast)  # the slow worker pushes the stalest gradients
    assert bounded["dropped"] > 0 and bounded["applied"] + bounded["dropped"] == 16
    applied = [s["staleness"] for s in bounded["staleness"]]
    assert all(s <= 0 for s, _ in zip(applied, range(bounded["applied"]))) or bounded["dropped"] > 0


@pytest.mark.parametrize("options, fragment", [
    ({"strategy": "magic"}, "strategy='magic' is not allowed"),
    ({"model": "resnet"}, "model='resnet' is not allowed"),
    ({"bucket_mb": 0}, "bucket_mb=0 is not allowed"),
    ({"bucket_mb": -1.0}, "bucket_mb=-1.0 is not allowed"),
    ({"accum_steps": 0}, "accum_steps=0 is not allowed"),
    ({"optimizer": "lbfgs"}, "optimizer='lbfgs' is not allowed"),
    ({"steps": 0}, "steps=0 is not allowed"),
])
def test_bad_configuration_is_refused_before_any_rank_starts(options, fragment):
    with pytest.raises(ValueError, match=fragment):
        TrainConfig(**options).check(2)


def test_only_strategies_that_wait_after_backward_take_the_course_all_reduce():
    for strategy in ("overlap", "ddp", "int8", "deterministic", "async", "local"):
        with pytest.raises(ValueError, match=f"all_reduce='ring' is not allowed with strategy='{strategy}'"):
            TrainConfig(strategy=strategy, all_reduce="ring").check(3)
    with pytest.raises(ValueError, match="all_reduce='butterfly' is not allowed: choose one of builtin, ring, tree"):
        TrainConfig(strategy="naive", all_reduce="butterfly").check(3)
    assert TrainConfig(strategy="naive", all_reduce="tree").check(3).all_reduce == "tree"


@pytest.mark.slow
def test_compare_trains_with_the_course_ring_and_stays_exact():
    """`dpteach compare -w 3 --all-reduce ring --json`: naive and bucketed run the course's ring, the
    other strategies torch's, and every exact strategy ends within the tolerance of one process."""
    out = subprocess.run([sys.executable, "-m", "dpteach", "compare", "-w", "3", "--all-reduce", "ring", "--json",
                          "--steps", "6"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["all_reduce"] == "ring" and report["world_size"] == 3
    used = {row["strategy"]: row["all_reduce"] for row in report["rows"]}
    assert used["naive"] == used["bucketed"] == "ring" and used["overlap"] == used["ddp"] == "builtin"
    for row in report["rows"]:
        if row["exact"]:
            assert row["max_abs_diff_vs_single"] <= report["tolerance"], row
            assert row["replicas_identical"], row


def test_async_needs_a_worker_besides_the_server():
    with pytest.raises(ValueError, match="strategy='async' with world_size=1 is not allowed"):
        TrainConfig(strategy="async").check(1)


@pytest.mark.slow
def test_interleaved_strategies_give_the_same_results_as_sequential_ones():
    strategies = ("local", "bucketed", "overlap", "ddp")
    seq = compare_strategies(2, steps=3, strategies=strategies, batch_per_rank=8)
    mixed = compare_strategies(2, steps=3, strategies=strategies, batch_per_rank=8, interleave=True)
    for a, b in zip(seq["rows"], mixed["rows"]):
        assert a["strategy"] == b["strategy"] and a["final_loss"] == b["final_loss"]
        assert a["max_abs_diff_vs_single"] == b["max_abs_diff_vs_single"]


@pytest.mark.slow
def test_compare_cli_json_and_errors():
    cmd = [sys.executable, "-m", "dpteach.cli", "compare", "-w", "2", "--steps", "3", "--batch", "8",
           "--strategies", "local,naive,overlap,ddp", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert {"world_size", "backend", "device", "model", "rows"} <= set(report)
    assert [r["strategy"] for r in report["rows"]] == ["local", "naive", "overlap", "ddp"]
    assert report["link"] is None  # no emulated link unless asked for
    for row in report["rows"]:
        assert set(row) == {"strategy", "all_reduce", "step_time_s", "exposed_comm_s", "exposed_how", "overhead_s",
                            "overhead_parts", "bytes_per_step", "final_loss", "max_abs_diff_vs_single", "exact",
                            "replicas_identical", "state_bytes_per_rank", "peak_bytes_per_rank",
                            "allocator_peak_bytes_per_rank", "link_report", "comm_s_per_rank", "knobs",
                            "mean_step_time_s", "steps_to_target", "time_to_target_s", "bytes_per_step_whole_run",
                            "bytes_counted_from_step", "time_to_target_spread_s", "quantisation",
                            "largest_step_bytes"}  # no link of two levels: no bytes per level
        assert row["allocator_peak_bytes_per_rank"] is None  # CPU ranks: no CUDA allocator
        assert row["exposed_how"] == "measured wait" and row["overhead_s"] >= 0
        assert row["peak_bytes_per_rank"] >= row["state_bytes_per_rank"] > 0
        assert row["link_report"] is None and row["all_reduce"] == "builtin"
        assert row["exact"] == (row["strategy"] != "local")
        if row["strategy"] != "local":
            assert row["replicas_identical"] and row["max_abs_diff_vs_single"] <= SGD_TOLERANCE
    bad = subprocess.run([*cmd[:-1], "--accum", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "accum_steps=0 is not allowed" in bad.stderr
    for extra, message in ((["--link", "5gbe"], "link='5gbe' is not allowed"),
                           (["--link-alpha", "1e-5"], "give --link NAME, or both --link-alpha and --link-beta")):
        bad = subprocess.run([*cmd[:-1], *extra], capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr


@pytest.mark.slow
def test_compare_on_an_emulated_link_stays_exact_and_reports_the_link():
    cmd = [sys.executable, "-m", "dpteach.cli", "compare", "-w", "2", "--steps", "4", "--batch", "8",
           "--strategies", "local,bucketed,overlap,ddp,fp16,async", "--link-alpha", "2e-3", "--link-beta", "1e-9",
           "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["link"] == {"name": "custom", "alpha_s": 2e-3, "beta_s_per_byte": 1e-9}
    rows = {row["strategy"]: row for row in report["rows"]}
    link_s = report["rows"][0]["link_report"]  # local sends nothing: no account
    assert link_s is None and rows["async"]["link_report"] is None  # not emulated: said so
    for name in ("bucketed", "overlap", "ddp"):
        assert rows[name]["max_abs_diff_vs_single"] <= SGD_TOLERANCE and rows[name]["replicas_identical"]
        account = rows[name]["link_report"]
        assert account["messages_per_step"] >= 1 and account["time_set_by"] in ("link", "machine")
        # at 2 ms per message, every message costs at least 2(W-1) alpha = 4 ms of link time
        assert account["link_seconds_per_step"] >= 4e-3 * account["messages_per_step"]
    # the step can be no shorter than the link's time for what bucketed sends after backward
    assert rows["bucketed"]["exposed_comm_s"] >= 0.9 * rows["bucketed"]["link_report"]["link_seconds_per_step"]


def _hooks_on(model) -> list:
    """Every hook Python can see on ``model``: on its modules, and on its parameters (tensor and
    post-accumulate hooks)."""
    found = [(name, kind) for name, module in model.named_modules()
             for kind in ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks", "_backward_pre_hooks")
             if getattr(module, kind)]
    return found + [(name, kind) for name, p in model.named_parameters()
                    for kind in ("_post_accumulate_grad_hooks", "_backward_hooks") if getattr(p, kind, None)]


def _each_strategy_in_turn_on_one_model(names, model_name):
    from dpteach.ranks import context
    from dpteach.replica.data import loss_fn, make_dataset, sample_batch
    from dpteach.sync import make_strategy
    from dpteach.replica.timeline import Timeline
    model = build_model(model_name, seed=0)
    x, y = sample_batch(make_dataset(model_name, 8, seed=dist.get_rank()), range(8))
    left = {}
    for name in names:
        strategy = make_strategy(name, model, Timeline(context.device()))
        optimizer = strategy.make_optimizer(lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9))
        for step in range(2):
            strategy.start_step(step)
            with strategy.micro_batch(sync=True):
                loss_fn(model_name)(strategy.wrap()(x), y).backward()
            strategy.finish(step)
            strategy.step_optimizer(optimizer)
        strategy.unshard()
        strategy.close()
        left[name] = _hooks_on(model)
    return left


@pytest.mark.slow  # more than 4 s on 2 cores: in `make test`, not `make test-fast`
@pytest.mark.parametrize("model_name", ["mlp", "transformer"])
def test_a_model_trained_by_each_strategy_in_turn_is_left_with_no_hook(model_name):
    names = ["naive", "bucketed", "overlap", "deterministic", "int8_ef", "fp16", "zero1", "zero2", "zero3", "overlap"]
    left = dpteach.launch(_each_strategy_in_turn_on_one_model, 2, args=(names, model_name), timeout=300,
                          show_output=False)
    assert left[0] == left[1] == {name: [] for name in names}


def test_the_single_process_reference_is_kept_per_kernel_only_for_what_it_reads():
    from dpteach.training import reference
    config = TrainConfig(model="mlp", steps=3, strategy="bucketed")
    reference._REFERENCES.clear()
    first = reference.train_single_process(config, 2)
    # a control the one process does not read (how ranks sync, bucket, send): the kept reference, as a copy
    unread = replace(config, strategy="local_sgd", bucket_mb=4.0, knobs={"sync_every": 3})
    again = reference.train_single_process(unread, 2)
    assert len(reference._REFERENCES) == 1 and torch.equal(first["params"], again["params"])
    again["params"].add_(1.0)  # a caller's copy is its own
    assert torch.equal(reference.train_single_process(config, 2)["params"], first["params"])
    # one it does read trains again, and gives what a fresh kernel would
    other = reference.train_single_process(replace(config, steps=4), 2)
    assert len(reference._REFERENCES) == 2 and not torch.equal(other["params"], first["params"])
    reference._REFERENCES.clear()
    assert torch.equal(reference.train_single_process(replace(config, steps=4), 2)["params"], other["params"])
