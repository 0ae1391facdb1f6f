"""Activation memory (lesson 15): the saved tensors counted against hand counts, the per-sample slope, and
checkpointing held to the plain model with torch as the oracle. No timing is asserted: timings are reported."""
import math

import pytest
import torch
from torch import nn

from dpteach.experiments.activations import activation_memory, checkpointing
from dpteach.replica.activations import activation_profile, blocks, checkpointed, saved_activation_bytes
from dpteach.replica.data import loss_fn, make_dataset, sample_batch
from dpteach.replica.model_states import GB
from dpteach.replica.models import build_model

F32 = 4


def _batch(name, size):
    return sample_batch(make_dataset(name, size, seed=0), range(size))


def _sum_loss(output, _targets):
    return output.sum()  # its backward needs only the shape: it saves nothing


def test_a_linear_and_gelu_save_their_inputs_and_nothing_else():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU())
    x = torch.randn(4, 8)
    result = saved_activation_bytes(model, x, torch.zeros(4), _sum_loss)
    # addmm keeps its input x for the weight's gradient; GELU keeps its input, the (4, 16) pre-activation
    assert result["saved_bytes"] == 4 * 8 * F32 + 4 * 16 * F32
    assert result["batch_bytes"] == 4 * 8 * F32 and result["storages"] == 2
    assert result["by_block"] == [] and result["allocator_bytes"] is None


class _Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.full((16,), 2.0))

    def forward(self, x):
        return x * self.scale  # mul keeps the buffer for x's gradient


def test_parameters_and_buffers_are_saved_by_autograd_but_not_counted():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), _Scaled())
    x = torch.randn(4, 8, requires_grad=True)  # so that addmm keeps the weight as well
    state = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    packed = set()

    def pack(t):
        packed.add(t.untyped_storage().data_ptr())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x).sum()
    assert {model[0].weight.untyped_storage().data_ptr(), model[2].scale.untyped_storage().data_ptr()} <= packed
    result = saved_activation_bytes(model, x, torch.zeros(4), _sum_loss)
    # x and GELU's input, as without them: the weight (kept by addmm for x's gradient) and the buffer (kept
    # by the mul for its input's gradient) are model state; the mul keeps nothing else (the buffer needs none)
    assert result["saved_bytes"] == 4 * 8 * F32 + 4 * 16 * F32
    assert result["storages"] == len(packed - state) == 2


def test_the_mlp_keeps_what_a_hand_count_says_with_and_without_checkpointing():
    b = 32
    model, (x, y) = build_model("mlp"), _batch("mlp", b)
    hidden = b * 512 * F32
    # outside the blocks: the batch (x for the first Linear, the targets), the last Linear's input, the
    # loss's log-softmax and one scalar; each block's input; each GELU's input (the block's internals)
    outside = b * 64 * F32 + b * 8 + hidden + b * 10 * F32 + F32
    inputs_kept = 4 * hidden  # blocks 1-4 (block 0's input is x)
    plain = saved_activation_bytes(model, x, y, loss_fn("mlp"))
    assert plain["saved_bytes"] == outside + inputs_kept + 5 * hidden
    assert plain["by_block"] == [hidden] * 5
    every = saved_activation_bytes(model, x, y, loss_fn("mlp"), checkpoint_every=1)
    assert every["saved_bytes"] == outside + inputs_kept and every["by_block"] == [0] * 5
    odd = saved_activation_bytes(model, x, y, loss_fn("mlp"), checkpoint_every=2)  # blocks 0, 2, 4
    assert odd["by_block"] == [0, hidden, 0, hidden, 0]


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_checkpointing_keeps_the_block_inputs_and_drops_their_internals(name):
    model, (x, y) = build_model(name), _batch(name, 8)
    plain = saved_activation_bytes(model, x, y, loss_fn(name))
    every = saved_activation_bytes(model, x, y, loss_fn(name), checkpoint_every=1)
    assert min(plain["by_block"]) > 0
    assert every["saved_bytes"] == plain["saved_bytes"] - sum(plain["by_block"])


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_saved_bytes_grow_linearly_with_the_batch(name):
    b = 4
    model = build_model(name)
    sizes = [saved_activation_bytes(model, *_batch(name, k * b), loss_fn(name))["saved_bytes"] for k in (1, 2, 3)]
    assert sizes[2] - sizes[1] == sizes[1] - sizes[0] > 0
    profile = activation_profile(name, 2 * b)  # measured at b and 2b
    assert profile["per_sample_bytes"] * b == sizes[1] - sizes[0]
    assert 0 <= profile["fixed_bytes"] < profile["per_sample_bytes"]
    assert profile["fixed_bytes"] + 3 * b * profile["per_sample_bytes"] == sizes[2]


@pytest.mark.parametrize("name,every", [("mlp", 1), ("mlp", 2), ("cnn", 1), ("transformer", 1), ("transformer", 2)])
def test_the_checkpointed_model_has_the_plain_models_loss_and_gradients(name, every):
    model, (x, y) = build_model(name, seed=3), _batch(name, 8)
    criterion = loss_fn(name)

    def run(module):
        model.zero_grad(set_to_none=True)
        loss = criterion(module(x), y)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    names_before = list(model.state_dict())
    wrapped = checkpointed(model, every)
    assert [id(p) for p in wrapped.parameters()] == [id(p) for p in model.parameters()]
    (loss, grads), (loss_ckpt, grads_ckpt) = run(model), run(wrapped)  # torch's plain model is the oracle
    assert torch.allclose(loss_ckpt, loss, rtol=0, atol=1e-6)
    for g, g_ckpt in zip(grads, grads_ckpt):
        assert torch.allclose(g_ckpt, g, rtol=0, atol=1e-6)
    assert list(model.state_dict()) == names_before  # the model itself is left as it was
    assert not any("Checkpointed" in type(m).__name__ for m in model.modules())


def test_blocks_are_the_repeated_units():
    mlp, cnn, transformer = (blocks(name) for name in ("mlp", "cnn", "transformer"))
    assert len(mlp) == 5 and all([type(m) for m in b] == [nn.Linear, nn.GELU] for b in mlp)
    assert len(cnn) == 3 and all([type(m) for m in b] == [nn.Conv2d, nn.GroupNorm, nn.GELU] for b in cnn)
    model = build_model("transformer")
    assert blocks(model) == list(model.blocks.layers) and len(transformer) == 2


def test_checkpointing_every_block_saves_at_least_40_percent_of_the_transformers_bytes():
    plain, every = activation_profile("transformer", 32), activation_profile("transformer", 32, checkpoint_every=1)
    assert every["saved_bytes"] <= 0.6 * plain["saved_bytes"]
    assert every["per_sample_bytes"] < plain["per_sample_bytes"]
    # during backward one layer's internals exist again: the peak lies between the two
    assert every["saved_bytes"] < every["peak_bytes"] < plain["saved_bytes"]


def test_the_largest_micro_batch_is_the_room_left_divided_by_a_sample():
    result = activation_memory(models=("mlp", "transformer"), batch=8, memory_gb=0.05, device="cpu")
    assert result["source"] and result["note"]
    for row in result["rows"]:
        for suffix in ("", "_checkpointed"):
            n = row["largest_micro_batch" + suffix]
            per = row["checkpointed_per_sample_bytes" if suffix else "per_sample_bytes"]
            fixed = row["checkpointed_fixed_bytes" if suffix else "fixed_bytes"]
            assert row["state_bytes"] + fixed + n * per <= 0.05 * GB < row["state_bytes"] + fixed + (n + 1) * per
        assert row["largest_micro_batch_checkpointed"] >= row["largest_micro_batch"] > 0
        assert row["state_bytes"] == 16 * row["num_params"]  # fp32 Adam: 4 + 4 + 8
    tiny = activation_memory(models="mlp", batch=4, memory_gb=0.01, device="cpu")["rows"][0]
    assert tiny["largest_micro_batch"] == 0 and "do not fit" in tiny["why"]


def test_checkpointing_reports_bytes_and_times_of_the_same_step():
    threads = torch.get_num_threads()
    result = checkpointing(models="mlp", batch=8, repeats=1, warmup=0)
    assert torch.get_num_threads() == threads and result["threads"] == 1  # set for the run, then restored
    row = result["rows"][0]
    assert row["same_loss"] and row["max_grad_diff"] <= 1e-6
    assert 0 < row["share_saved"] < 1 and row["peak_share_saved"] < row["share_saved"]
    assert all(row[k] > 0 for k in ("plain_step_s", "checkpointed_step_s", "forward_s", "step_time_ratio"))
    assert math.isclose(row["step_time_ratio"], row["checkpointed_step_s"] / row["plain_step_s"])
    assert row["ratio"]["low"] <= row["ratio"]["median"] <= row["ratio"]["high"] and row["ratio"]["n"] == 1
    assert row["versus_prediction"] in ("above", "below", "within") and row["slower"] in (True, False)


def test_a_ratio_is_called_above_or_below_its_prediction_only_when_the_intervals_separate():
    from dpteach.experiments.activations import _versus
    from dpteach.measure import spread
    predicted = spread([1.30, 1.32, 1.28, 1.31, 1.29])
    assert _versus(spread([1.5, 1.6, 1.55, 1.52, 1.58]), predicted) == "above"
    assert _versus(spread([1.1, 1.05, 1.08, 1.12, 1.07]), predicted) == "below"
    assert _versus(spread([1.1, 1.5, 1.3, 1.2, 1.4]), predicted) == "within"


@pytest.mark.parametrize("call,message", [
    (lambda: saved_activation_bytes(build_model("mlp"), *_batch("mlp", 2), loss_fn("mlp"), checkpoint_every=-1),
     "checkpoint_every=-1 is not allowed"),
    (lambda: checkpointed(nn.Linear(2, 2)), "model='Linear' is not allowed"),
    (lambda: checkpointed(build_model("mlp"), every=0), "every=0 is not allowed"),
    (lambda: blocks("resnet"), "model='resnet' is not allowed"),
    (lambda: activation_profile("mlp", 1), "batch=1 is not allowed"),
    (lambda: activation_memory(memory_gb=0, device="cpu"), "memory_gb=0 is not allowed"),
    (lambda: activation_memory(optimizer="lion", device="cpu"), "optimizer='lion' is not allowed"),
    (lambda: activation_memory(models=["transformer-350m"], device="cpu"), "models='transformer-350m' is not allowed"),
    (lambda: activation_memory(models=[], device="cpu"), "models=[] is not allowed"),
    (lambda: checkpointing(repeats=0), "repeats=0 is not allowed"),
    (lambda: checkpointing(device="tpu"), "device='tpu' is not allowed"),
])
def test_bad_arguments_are_refused_with_a_clear_message(call, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        call()
