"""The models build from a seed, the synthetic tasks are learnable, and the data splits are exact.

All in one process, no process group: these are the foundations the multi-rank tests stand on.
"""
import math

import pytest
import torch

from dpteach.replica.data import (ShardedSampler, epoch_permutation, global_batches, loss_fn, make_dataset,
                          rank_microbatches, sample_batch)
from dpteach.replica.models import DEFAULT_BUCKET_MB, DEFAULT_LR, MODELS, NUM_CLASSES, SEQ_LEN, SPECS, VOCAB, build_model, \
    default_batch_per_rank, model_names, parameter_bytes, parameter_count

NAMES = model_names("cpu")  # the laptop models: every test below runs them whole on the CPU
GPU_SIZED = model_names("gpu")


def _output_shape(name, batch):
    return (batch, SEQ_LEN, VOCAB) if name == "transformer" else (batch, NUM_CLASSES)


def _same_weights(a, b):
    return all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))


def test_model_names_match_registry():
    assert NAMES == ["mlp", "cnn", "transformer"]
    assert GPU_SIZED == ["transformer-25m", "transformer-110m", "transformer-350m"]
    assert model_names() == NAMES + GPU_SIZED == list(MODELS)


@pytest.mark.parametrize("name, millions", [("transformer", 0.2858), ("transformer-25m", 27.4),
                                            ("transformer-110m", 111.0), ("transformer-350m", 353.7)])
def test_the_transformer_family_has_the_sizes_it_names(name, millions):
    """Counted on the meta device and, for the two that a CPU builds in a moment, on the real one."""
    assert parameter_count(name) == pytest.approx(millions * 1e6, rel=0.01)
    if parameter_count(name) < 50e6:
        assert sum(p.numel() for p in build_model(name).parameters()) == parameter_count(name)


@pytest.mark.parametrize("name", GPU_SIZED)
def test_gpu_sized_models_keep_the_exactness_rules_and_ddp_buckets(name):
    modules = list(build_model(name, device="meta").modules())
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in modules)
    assert all(m.p == 0.0 for m in modules if isinstance(m, torch.nn.Dropout))
    assert DEFAULT_BUCKET_MB[name] == 25.0  # DDP's default cap: their gradients are hundreds of MiB
    assert 4 * parameter_count(name) > 4 * 25 * 2**20  # ... so there are several buckets of it
    assert default_batch_per_rank(name) == SPECS[name].batch_per_rank < default_batch_per_rank("mlp")


@pytest.mark.slow  # 12 s on 2 cores
def test_the_smallest_gpu_sized_model_runs_and_its_loss_falls_on_the_cpu(one_thread):
    """The 27 M transformer, 8 steps of 4 sequences of 256 tokens at its learning rate with momentum,
    as training runs it: the loss leaves ln(vocab) (a uniform guess over 8192 ids) for well below it."""
    name = "transformer-25m"
    torch.manual_seed(0)
    model, data, loss_of = build_model(name), make_dataset(name, 32), loss_fn(name)
    inputs, targets = sample_batch(data, range(4))
    assert model(inputs).shape == (4, SPECS[name].seq_len, SPECS[name].vocab)
    optimizer = torch.optim.SGD(model.parameters(), lr=DEFAULT_LR[name], momentum=0.9)
    losses = []
    for indices in global_batches(data, 4, world_size=1):
        loss = loss_of(model(sample_batch(data, indices)[0]), sample_batch(data, indices)[1])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(SPECS[name].vocab), rel=0.05)
    assert min(losses[-3:]) < 0.75 * losses[0], losses


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_weights_different_seed_different(name):
    assert _same_weights(build_model(name, seed=3), build_model(name, seed=3))
    assert not _same_weights(build_model(name, seed=3), build_model(name, seed=4))


def test_build_model_leaves_global_random_state_alone():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    build_model("mlp", seed=1)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("name", NAMES)
def test_forward_shape_and_finite_loss(name):
    model, data = build_model(name), make_dataset(name, 8)
    inputs, targets = sample_batch(data, range(8))
    out = model(inputs)
    assert out.shape == _output_shape(name, 8)
    assert torch.isfinite(loss_fn(name)(out, targets))
    assert parameter_bytes(model) == 4 * sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", NAMES)
def test_no_dropout_or_batch_norm(name):
    modules = list(build_model(name).modules())
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in modules)
    # nn.TransformerEncoderLayer always holds Dropout modules; they must be switched off.
    assert all(m.p == 0.0 for m in modules if isinstance(m, torch.nn.Dropout))


@pytest.mark.parametrize("name", NAMES)
def test_forward_is_deterministic_and_batch_independent(name):
    """Splitting a batch must not change any sample's output: data parallelism relies on it."""
    model = build_model(name)
    inputs, _ = sample_batch(make_dataset(name, 8), range(8))
    whole = model(inputs)
    halves = torch.cat([model(inputs[:4]), model(inputs[4:])])
    torch.testing.assert_close(whole, halves, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_dataset_is_deterministic_from_seed(name):
    a, b, c = make_dataset(name, 16, seed=5), make_dataset(name, 16, seed=5), make_dataset(name, 16, seed=6)
    assert all(torch.equal(x, y) for x, y in zip(a.tensors, b.tensors))
    assert not torch.equal(a.tensors[0], c.tensors[0])


@pytest.fixture
def one_thread():
    """Train on one thread: on a shared 2-core machine, spinning intra-op threads only slow it down."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", NAMES)
def test_loss_falls_with_plain_sgd(name, one_thread):
    batch, steps = 64, 40
    model, data, loss_of = build_model(name), make_dataset(name, batch * steps), loss_fn(name)
    optimizer = torch.optim.SGD(model.parameters(), lr=DEFAULT_LR[name])
    losses = []
    for indices in global_batches(data, batch, world_size=1):
        inputs, targets = sample_batch(data, indices)
        loss = loss_of(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert len(losses) == steps
    assert sum(losses[-5:]) / 5 < 0.7 * losses[0], losses


def test_transformer_targets_are_inputs_shifted_by_one():
    inputs, targets = make_dataset("transformer", 4).tensors
    assert inputs.shape == targets.shape == (4, SEQ_LEN)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])


# --- ShardedSampler ---------------------------------------------------------------------------


def _shards(n, world, epoch=0, **kwargs):
    samplers = [ShardedSampler(n, world, r, **kwargs) for r in range(world)]
    for s in samplers:
        s.set_epoch(epoch)
    return [list(s) for s in samplers]


@pytest.mark.parametrize("n,world", [(24, 4), (30, 3), (7, 1)])
def test_shards_partition_the_epoch(n, world):
    shards = _shards(n, world)
    assert all(len(s) == n // world == len(ShardedSampler(n, world, 0)) for s in shards)
    together = [i for s in shards for i in s]
    assert len(set(together)) == len(together)            # disjoint
    assert sorted(together) == list(range(n))             # and complete


def test_drop_last_leaves_out_the_remainder_and_padding_fills_it():
    dropped = [i for s in _shards(10, 4) for i in s]
    assert len(dropped) == len(set(dropped)) == 8
    padded = _shards(10, 4, drop_last=False)
    assert all(len(s) == 3 for s in padded)
    assert set(i for s in padded for i in s) == set(range(10))


def test_set_epoch_reshuffles_and_every_rank_agrees():
    assert _shards(32, 2, epoch=0) == _shards(32, 2, epoch=0)
    assert _shards(32, 2, epoch=0) != _shards(32, 2, epoch=1)
    # each rank's share is the same slice of the one shared permutation
    perm = epoch_permutation(32, seed=0, epoch=1)
    assert _shards(32, 2, epoch=1) == [perm[0::2], perm[1::2]]


def test_forgetting_set_epoch_repeats_the_order():
    sampler = ShardedSampler(32, 2, 0)
    assert list(sampler) == list(sampler)


def test_different_ranks_get_different_samples_and_no_shuffle_is_strided():
    first, second = _shards(32, 2)
    assert set(first).isdisjoint(second)
    assert _shards(6, 2, shuffle=False) == [[0, 2, 4], [1, 3, 5]]


# --- global batches and micro-batches -----------------------------------------------------------


@pytest.mark.parametrize("batch,world,accum", [(4, 2, 1), (2, 3, 2), (3, 4, 3), (5, 1, 4)])
def test_microbatches_of_all_ranks_make_up_the_global_batch(batch, world, accum):
    data = range(100)
    steps = list(global_batches(data, batch, world, accum, seed=1, epoch=2))
    size = batch * world * accum
    assert len(steps) == 100 // size and all(len(g) == size for g in steps)
    assert [i for g in steps for i in g] == epoch_permutation(100, seed=1, epoch=2)[:len(steps) * size]
    for g in steps:
        parts = [rank_microbatches(g, r, world, batch, accum) for r in range(world)]
        assert all(len(p) == accum and all(len(m) == batch for m in p) for p in parts)
        assert sorted(i for p in parts for m in p for i in m) == sorted(g)
        # micro-batch k of rank r is slice k*W + r of the global batch
        assert parts[world - 1][accum - 1] == g[-batch:]


def test_global_batches_change_with_epoch():
    assert next(global_batches(range(64), 8, 2, epoch=0)) != next(global_batches(range(64), 8, 2, epoch=1))


# --- errors name the argument -------------------------------------------------------------------


@pytest.mark.parametrize("call,argument", [
    (lambda: build_model("resnet"), "model='resnet'"),
    (lambda: make_dataset("gpt", 4), "model='gpt'"),
    (lambda: make_dataset("mlp", 0), "num_samples=0"),
    (lambda: loss_fn("x"), "model='x'"),
    (lambda: ShardedSampler(10, 0, 0), "num_replicas=0"),
    (lambda: ShardedSampler(10, 2, 2), "rank=2"),
    (lambda: ShardedSampler(10, 2, -1), "rank=-1"),
    (lambda: ShardedSampler(0, 2, 0), "dataset_len=0"),
    (lambda: ShardedSampler(10, 2, 0).set_epoch(-1), "epoch=-1"),
    (lambda: ShardedSampler(10, 2, 0, seed=-3), "seed=-3"),
    (lambda: ShardedSampler(1, 2, 0), "dataset_len=1"),
    (lambda: global_batches(range(10), 0, 2), "batch_per_rank=0"),
    (lambda: global_batches(range(10), 2, 2, accum_steps=0), "accum_steps=0"),
    (lambda: global_batches(range(10), 4, 2, accum_steps=2), "batch_per_rank*world_size*accum_steps=16"),
    (lambda: rank_microbatches(list(range(8)), 4, 4, 2), "rank=4"),
    (lambda: rank_microbatches(list(range(8)), 0, 2, 2, accum_steps=0), "accum_steps=0"),
    (lambda: rank_microbatches(list(range(7)), 0, 2, 2, accum_steps=2), "global_indices of length 7"),
])
def test_bad_arguments_raise_value_error_naming_them(call, argument):
    with pytest.raises(ValueError, match="is not allowed") as error:
        call()
    assert argument in str(error.value)
