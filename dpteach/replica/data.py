"""Synthetic data for the course's models, and the rules that split it between ranks.

The data is made on the spot from a seed, so nothing is downloaded and every process that asks for
the same dataset gets the same tensors. Each task is easy enough that plain SGD lowers the loss
within a few dozen steps (the lessons want to see curves move, not to reach a benchmark), yet
not trivial, so the curves of different strategies can be told apart.

Two seeds are at play. The *task* (class centres, image patterns) is fixed by ``TASK_SEED``, so
two datasets with different ``seed`` values are two samples of the same problem: a training set
and a held-out set. ``seed`` only chooses which samples are drawn.

The second half of the module says which sample goes to which rank. Data parallelism is only
correct if, at every step, the ranks together see the global batch that one process would have
seen; :func:`global_batches` and :func:`rank_microbatches` pin that down so the single-process
reference and a W-rank run can be compared number for number.
"""
from __future__ import annotations

import math
from typing import Iterator

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, Sampler, TensorDataset

from .. import validate
from .models import IMAGE_SHAPE, INPUT_DIM, NUM_CLASSES, SPECS, check_model_name, is_transformer

TASK_SEED = 1234
MAX_STEP = 4  # transformer task: each sequence counts up by a step of 1..MAX_STEP
# Transformer task: sequences count modulo this many token ids, for every size of the family. The
# GPU-sized models keep their full vocabulary - the embedding and the output layer over all of it cost
# what a language model's do - but a task over 16k ids, with a few thousand tokens per step, would teach
# them nothing visible in the 20 steps of a lesson; over 64 ids the loss falls at once.
TASK_VOCAB = 64


def _check_int(name: str, value, minimum: int) -> int:
    return validate.integer(name, value, low=minimum)


def _check_rank(rank, world_size: int, world_name: str = "world_size") -> int:
    return validate.integer("rank", rank, 0, world_size - 1, why=f" for {world_name}={world_size}")


# ---------------------------------------------------------------------------------------------
# Datasets


def _gaussian_classes(num_samples: int, gen: torch.Generator) -> TensorDataset:
    """MLP task: 10 Gaussian clouds in 64 dimensions; the label is the cloud a point came from.

    The centres sit at distance ~4 from each other while the noise has unit variance per feature,
    so the clouds overlap a little: the loss falls fast at first, then keeps falling slowly.
    """
    centres = torch.randn(NUM_CLASSES, INPUT_DIM, generator=torch.Generator().manual_seed(TASK_SEED))
    centres *= 4 / math.sqrt(2 * INPUT_DIM)
    labels = torch.randint(0, NUM_CLASSES, (num_samples,), generator=gen)
    inputs = centres[labels] + torch.randn(num_samples, INPUT_DIM, generator=gen)
    return TensorDataset(inputs, labels)


def _patterned_images(num_samples: int, gen: torch.Generator) -> TensorDataset:
    """CNN task: each class has a fixed smooth 16x16 pattern; an image is its pattern plus noise.

    A pattern is random noise blurred with a 5x5 box filter, so it has blobs and edges a
    convolution can pick up. It is drawn at 0.3 times the strength of the pixel noise: one pixel
    says almost nothing about the class, but the whole image does, which is what the filters learn
    to add up.
    """
    noise = torch.randn(NUM_CLASSES, *IMAGE_SHAPE, generator=torch.Generator().manual_seed(TASK_SEED))
    patterns = F.avg_pool2d(noise, 5, stride=1, padding=2, count_include_pad=False)
    patterns /= patterns.std(dim=(1, 2, 3), keepdim=True)
    labels = torch.randint(0, NUM_CLASSES, (num_samples,), generator=gen)
    inputs = 0.3 * patterns[labels] + torch.randn(num_samples, *IMAGE_SHAPE, generator=gen)
    return TensorDataset(inputs, labels)


def _counting_sequences(num_samples: int, gen: torch.Generator, vocab: int, seq_len: int) -> TensorDataset:
    """Transformer task: sequences that count up modulo ``vocab`` by a step of their own, e.g. 5 7 9 11 ...

    The step (1..MAX_STEP) differs from sequence to sequence, so the next token cannot be told from
    the current token alone: the model has to look back (attention) to find the step. Inputs are
    tokens 0..seq_len-1 and targets are tokens 1..seq_len, i.e. the input shifted by one. Every size
    of the transformer family gets the same task (``TASK_VOCAB`` ids), at its own sequence length.
    """
    start = torch.randint(0, vocab, (num_samples, 1), generator=gen)
    step = torch.randint(1, MAX_STEP + 1, (num_samples, 1), generator=gen)
    tokens = (start + step * torch.arange(seq_len + 1)) % vocab
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


def make_dataset(model: str, num_samples: int, seed: int = 0) -> TensorDataset:
    """``num_samples`` (input, target) pairs for ``model``, the same every time for the same ``seed``."""
    check_model_name(model)
    _check_int("num_samples", num_samples, 1)
    _check_int("seed", seed, 0)
    gen = torch.Generator().manual_seed(seed)
    if is_transformer(model):
        return _counting_sequences(num_samples, gen, min(SPECS[model].vocab, TASK_VOCAB), SPECS[model].seq_len)
    return {"mlp": _gaussian_classes, "cnn": _patterned_images}[model](num_samples, gen)


def loss_fn(model_name: str):
    """The loss for ``model_name``: cross-entropy, averaged over the samples (and tokens) of a batch.

    The mean matters for data parallelism: with equal per-rank batches, the average of the ranks'
    mean losses is the mean loss over the global batch, so averaging gradients across ranks gives
    exactly the single-process gradient.
    """
    check_model_name(model_name)
    if is_transformer(model_name):
        def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            # (batch, seq, vocab) against (batch, seq): every position is one classification.
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return next_token_loss
    return F.cross_entropy


def sample_batch(dataset: TensorDataset, indices) -> tuple[torch.Tensor, torch.Tensor]:
    """The (inputs, targets) of the samples at ``indices``, stacked in that order."""
    return dataset[list(indices)]


# ---------------------------------------------------------------------------------------------
# Which rank sees which sample


def epoch_permutation(dataset_len: int, seed: int, epoch: int) -> list[int]:
    """The order of the samples in ``epoch``: a permutation drawn from ``seed + epoch``.

    It depends on nothing else, so every rank computes the same order without talking to the
    others, and the single-process reference computes it too.
    """
    return torch.randperm(dataset_len, generator=torch.Generator().manual_seed(seed + epoch)).tolist()


class ShardedSampler(Sampler[int]):
    """Gives rank ``rank`` of ``num_replicas`` its own share of each epoch: a readable DistributedSampler.

    Every epoch, all ranks compute the same permutation of the dataset (seeded by ``seed + epoch``)
    and rank r takes the positions r, r+W, r+2W, ... of it. The shares are disjoint and together
    cover the epoch, so no sample is seen twice and none is skipped.

    Call ``set_epoch(epoch)`` at the start of every epoch. The classic bug is to forget it: the
    sampler then keeps epoch 0, and every epoch repeats the same order, each rank seeing the same
    samples in the same batches every time. Nothing fails. (torch's ``DistributedSampler``
    documents exactly this: without ``set_epoch`` "the same ordering will be always used".)

    Every rank must yield the same number of samples, or the rank with fewer would stop calling
    all-reduce while the others wait for it: a hang. With ``drop_last=True`` the few samples left
    over after an equal split are left out of that epoch; with ``drop_last=False`` the epoch is
    padded by repeating its first samples until it splits evenly.
    """

    def __init__(self, dataset_len: int, num_replicas: int, rank: int, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = True):
        self.dataset_len = _check_int("dataset_len", dataset_len, 1)
        self.num_replicas = _check_int("num_replicas", num_replicas, 1)
        self.rank = _check_rank(rank, num_replicas, "num_replicas")
        self.seed = _check_int("seed", seed, 0)
        if drop_last and dataset_len < num_replicas:
            raise ValueError(f"dataset_len={dataset_len!r} is not allowed with drop_last=True: it must be "
                             f">= num_replicas={num_replicas} so that every rank gets a sample")
        self.shuffle, self.drop_last = shuffle, drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next ``iter()`` follows (see the class note)."""
        self.epoch = _check_int("epoch", epoch, 0)

    def __len__(self) -> int:
        if self.drop_last:
            return self.dataset_len // self.num_replicas
        return math.ceil(self.dataset_len / self.num_replicas)

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            order = epoch_permutation(self.dataset_len, self.seed, self.epoch)
        else:
            order = list(range(self.dataset_len))
        total = len(self) * self.num_replicas
        order = (order * math.ceil(total / self.dataset_len))[:total]  # trims, or pads by repeating
        return iter(order[self.rank::self.num_replicas])


def global_batches(dataset: Dataset, batch_per_rank: int, world_size: int, accum_steps: int = 1,
                   seed: int = 0, epoch: int = 0) -> Iterator[list[int]]:
    """An iterator over the optimizer steps of ``epoch``: each item is that step's global batch.

    With B = ``batch_per_rank``, W = ``world_size`` and K = ``accum_steps``, one optimizer step
    consumes G = B*W*K samples: each of W ranks runs K micro-batches of B. Step t's global batch
    is ``perm[t*G:(t+1)*G]`` of :func:`epoch_permutation`; samples left over after the last full
    step are dropped. The single-process reference trains on each global batch at once; a
    W-rank run splits it with :func:`rank_microbatches`. Each part holds B samples and the loss is
    a mean, so averaging the parts' gradients (over K micro-batches on a rank, then over W ranks)
    gives the gradient of the whole global batch. ``dataset`` may be anything with a length.
    """
    _check_int("batch_per_rank", batch_per_rank, 1)
    _check_int("world_size", world_size, 1)
    _check_int("accum_steps", accum_steps, 1)
    _check_int("seed", seed, 0)
    _check_int("epoch", epoch, 0)
    size = batch_per_rank * world_size * accum_steps
    if size > len(dataset):
        raise ValueError(f"batch_per_rank*world_size*accum_steps={size} is not allowed: it must be <= the "
                         f"dataset's {len(dataset)} samples, or not one step fits in an epoch")
    perm = epoch_permutation(len(dataset), seed, epoch)
    # A generator expression, not a generator function, so bad arguments raise here, at the call.
    return (perm[t * size:(t + 1) * size] for t in range(len(dataset) // size))


def rank_microbatches(global_indices: list[int], rank: int, world_size: int, batch_per_rank: int,
                      accum_steps: int = 1) -> list[list[int]]:
    """Rank ``rank``'s K micro-batches of one global batch, in the order it runs them.

    Micro-batch k of rank r is ``global_indices[(k*W + r)*B : (k*W + r + 1)*B]``: the global
    batch is read as K rounds of W consecutive slices, one slice per rank per round. Over all
    ranks and rounds every index is used exactly once, so the union is the global batch.
    """
    _check_int("world_size", world_size, 1)
    _check_rank(rank, world_size)
    _check_int("batch_per_rank", batch_per_rank, 1)
    _check_int("accum_steps", accum_steps, 1)
    size = batch_per_rank * world_size * accum_steps
    if len(global_indices) != size:
        raise ValueError(f"global_indices of length {len(global_indices)} is not allowed: it must hold "
                         f"batch_per_rank*world_size*accum_steps={size} indices")
    return split_for_rank(global_indices, rank, world_size, batch_per_rank, accum_steps)


def split_for_rank(global_indices, rank: int, world_size: int, batch_per_rank: int, accum_steps: int) -> list[list[int]]:
    """:func:`rank_microbatches` without its checks, for a training loop whose configuration was
    checked once before any rank started (``TrainConfig.check``): the split, and nothing else."""
    b, w = batch_per_rank, world_size
    return [list(global_indices[(k * w + rank) * b:(k * w + rank + 1) * b]) for k in range(accum_steps)]
