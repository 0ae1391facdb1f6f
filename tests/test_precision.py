"""Mixed precision (dpteach/replica/precision.py) held to PyTorch itself: the loss scaler against
``torch.amp.GradScaler``, DDP's 16-bit gradients against torch's own compression hooks, and on real
gloo ranks the properties lesson 12 shows (every rank skips the same steps; clipping scaled
gradients goes wrong)."""
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel
from torch.nn.utils import parameters_to_vector

import dpteach
from dpteach.replica.models import build_model
from dpteach.replica.precision import LossScaler, saved_for_backward
from dpteach.training.train import TrainConfig, train_each_on_rank


def _fp16_steps(model, data, optimizer, scaler_step, steps):
    x, y = data
    for step in range(steps):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(model(x[step::steps]), y[step::steps])
        scaler_step(loss)


def test_loss_scaler_follows_torch_grad_scaler():
    """Same scales, same skipped steps, same weights, bit for bit: the rule is GradScaler's."""
    torch.manual_seed(0)
    x, y = torch.randn(96, 16), torch.randn(96, 4)
    results = []
    for use_torch in (True, False):
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        torch.manual_seed(1)
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.3)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        scales, skipped = [], []
        if use_torch:
            scaler = torch.amp.GradScaler("cpu", init_scale=2.0**26, growth_interval=3)

            def step(loss):
                scaler.scale(loss).backward()
                scales.append(scaler.get_scale())
                before = [p.detach().clone() for p in model.parameters()]
                scaler.step(optimizer)
                scaler.update()
                skipped.append(all(torch.equal(a, p) for a, p in zip(before, model.parameters())))
        else:
            ours = LossScaler(init_scale=2.0**26, growth_interval=3)

            def step(loss):
                ours.scale_loss(loss).backward()
                scales.append(ours.scale.item())
                found = ours.unscale([p.grad for p in model.parameters()])
                if not found:
                    optimizer.step()
                skipped.append(found)
                ours.update(found)
        _fp16_steps(model, (x, y), optimizer, step, steps=12)
        results.append((scales, skipped, [p.detach().clone() for p in model.parameters()]))
    (t_scales, t_skipped, t_weights), (scales, skipped, weights) = results
    assert any(skipped) and not all(skipped), "the test must see both skipped and clean steps"
    assert scales == t_scales and skipped == t_skipped
    assert all(torch.equal(a, b) for a, b in zip(weights, t_weights))


def test_autocast_saves_half_precision_activations_and_weight_copies():
    model = build_model("mlp", seed=0)
    in_features = next(m for m in model.modules() if isinstance(m, torch.nn.Linear)).in_features
    x = torch.randn(32, in_features)

    def loss_of(m):
        return m(x).float().pow(2).mean()

    full, half = saved_for_backward(model, loss_of, "fp32"), saved_for_backward(model, loss_of, "bf16")
    assert full["weight_copies"] == 0 and full["activations"] > 0
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.dim() > 1)
    # every weight a matmul needs for the gradient of its input, in bf16: all but the first layer's
    assert 0.9 * param_bytes / 2 <= half["weight_copies"] <= param_bytes / 2
    assert half["activations"] < 0.75 * full["activations"]


def _ddp_with_torch_hook(model_name, hook, steps, batch):
    """Plain DDP with torch's own compression hook: the oracle for the course's grad_comm."""
    model = build_model(model_name, seed=0)
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    ddp = DistributedDataParallel(model)
    # DDP refuses a hook *named* bf16_compress_hook unless it runs on CUDA with NCCL 2.10+ (its
    # _check_comm_hook); gloo sums bf16 on the CPU, so the same function, under another name, runs here.
    ddp.register_comm_hook(None, lambda state, bucket: hook(state, bucket))
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(10 + dist.get_rank())
    in_features = next(m for m in model.modules() if isinstance(m, torch.nn.Linear)).in_features
    for _ in range(steps):
        x = torch.randn(batch, in_features, generator=generator)
        optimizer.zero_grad()
        ddp(x).pow(2).mean().backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def _ddp_with_course_hook(model_name, grad_comm, steps, batch):
    from dpteach.sync import make_strategy
    from dpteach.replica.timeline import Timeline
    model = build_model(model_name, seed=0)
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    strategy = make_strategy("ddp", model, Timeline(torch.device("cpu")), bucket_mb=25.0, grad_comm=grad_comm)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(10 + dist.get_rank())
    in_features = next(m for m in model.modules() if isinstance(m, torch.nn.Linear)).in_features
    sent = []
    for step in range(steps):
        x = torch.randn(batch, in_features, generator=generator)
        strategy.start_step(step)
        optimizer.zero_grad()
        strategy.wrap()(x).pow(2).mean().backward()
        optimizer.step()
        sent.append(strategy.wire_bytes)
    return [p.detach().clone() for p in model.parameters()], sent


def _both_hooks(dtype_name):
    hook = {"bf16": default_hooks.bf16_compress_hook, "fp16": default_hooks.fp16_compress_hook,
            "fp32": default_hooks.allreduce_hook}[dtype_name]
    oracle = _ddp_with_torch_hook("mlp", hook, steps=3, batch=16)
    ours, sent = _ddp_with_course_hook("mlp", dtype_name, steps=3, batch=16)
    return all(torch.equal(a, b) for a, b in zip(oracle, ours)), sent


@pytest.mark.slow  # 6 s: DDP on real ranks
def test_ddp_grad_comm_is_torchs_compression_hook():
    """grad_comm="bf16"/"fp16" gives the weights of torch's bf16/fp16_compress_hook, bit for bit, and
    sends half the bytes of fp32."""
    per_rank = [dpteach.launch(_both_hooks, 2, args=(name,), timeout=180, show_output=False)
                for name in ("fp32", "bf16", "fp16")]
    for name, ranks in zip(("fp32", "bf16", "fp16"), per_rank):
        assert all(equal for equal, _ in ranks), f"{name}: weights differ from torch's hook"
    fp32_sent, bf16_sent = per_rank[0][0][1], per_rank[1][0][1]
    assert [b / f for b, f in zip(bf16_sent, fp32_sent)] == [0.5] * len(fp32_sent)


@pytest.fixture(scope="module")
def fp16_runs():
    """SGD, so that the size of a gradient is the size of the update (Adam would divide it away)."""
    base = TrainConfig(strategy="ddp", steps=12, batch_per_rank=16, timing_warmup=0, precision="fp16",
                       init_scale=2.0**20, growth_interval=4, clip_norm=1.0)
    configs = {"fp16": base, "fp16, clipped before unscaling": replace(base, unscale_before_clip=False),
               "fp32": replace(base, precision="fp32", clip_norm=None), "bf16": replace(base, precision="bf16", clip_norm=None),
               "bf16 zero3": replace(base, strategy="zero3", precision="bf16", clip_norm=None)}
    per_rank = dpteach.launch(train_each_on_rank, 2, args=(list(configs.values()),), timeout=300, show_output=False)
    return {name: [rank[i] for rank in per_rank] for i, name in enumerate(configs)}


def _moved(run) -> float:
    """How far training moved the weights from where every run starts."""
    start = parameters_to_vector(build_model("mlp", seed=0).parameters()).detach()
    return (run[0]["params"] - start).norm().item()


@pytest.mark.slow  # more than 4 s on 2 cores: in `make test`, not `make test-fast`
def test_fp16_skips_the_same_steps_on_every_rank_and_halves_the_scale(fp16_runs):
    runs = fp16_runs["fp16"]
    report = runs[0]["precision"]
    assert all(r["precision"]["skipped"] == report["skipped"] for r in runs)
    assert all(r["replica_spread"] == 0.0 for r in runs)
    skipped, scales = report["skipped"], report["scales"]
    assert skipped[0], "a scale of 2^20 must overflow fp16 on the first step"
    assert not all(skipped)
    for now, after, skip in zip(scales, scales[1:], skipped):
        assert after == now / 2 if skip else after in (now, now * 2)
    assert 0 < _moved(runs)


def test_clipping_scaled_gradients_sees_the_norm_times_the_scale(fp16_runs):
    right, wrong = fp16_runs["fp16"][0]["precision"], fp16_runs["fp16, clipped before unscaling"][0]["precision"]
    assert right["skipped"][0] and wrong["skipped"][0]
    first_clean = right["skipped"].index(False)
    assert wrong["skipped"][:first_clean + 1] == right["skipped"][:first_clean + 1]  # identical until then
    ratio = wrong["grad_norms"][first_clean] / right["grad_norms"][first_clean]
    assert ratio == pytest.approx(right["scales"][first_clean], rel=1e-3)
    # clipped to the limit in scaled units, then divided by the scale: the updates all but vanish
    assert _moved(fp16_runs["fp16, clipped before unscaling"]) < 0.01 * _moved(fp16_runs["fp16"])


def test_bf16_runs_with_replicated_and_sharded_strategies_and_drifts_a_little(fp16_runs):
    fp32 = fp16_runs["fp32"]
    for name in ("bf16", "bf16 zero3"):
        runs = fp16_runs[name]
        assert all(r["replica_spread"] == 0.0 for r in runs)
        assert not any(runs[0]["precision"]["skipped"])
        drift = (runs[0]["params"] - fp32[0]["params"]).norm().item()
        assert 0 < drift < 0.2 * _moved(fp32), name


@pytest.mark.parametrize("options, named", [
    ({"precision": "fp8"}, "precision"),
    ({"grad_comm": "bf16", "strategy": "zero2"}, "grad_comm"),
    ({"precision": "fp16", "strategy": "zero3"}, "fp16"),
    ({"clip_norm": 1.0, "strategy": "fsdp"}, "clip_norm"),
    ({"precision": "bf16", "strategy": "async"}, "precision"),
    ({"clip_norm": -1.0}, "clip_norm"),
    ({"growth_interval": 0}, "growth_interval"),
])
def test_precision_options_are_refused_with_a_reason(options, named):
    with pytest.raises(ValueError, match=named):
        TrainConfig(**{"strategy": "ddp", **options}).check(4)
