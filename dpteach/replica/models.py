"""The models the lessons train: three sized for a laptop's CPU, and a transformer family sized for GPUs.

They are defined here in code, so nothing is downloaded. The first three are sized for a laptop: for the
MLP and the CNN, on one CPU thread, a forward and backward pass over a per-rank batch of 32 samples
takes about as long as a gloo all-reduce of all their gradients between 2-4 local processes (a few
milliseconds each). That balance is what makes the course's questions interesting: if compute
dwarfed communication, no synchronisation strategy would matter; if communication dwarfed compute,
overlap could hide little. The transformer shows the compute-heavy side (see its note).

On a GPU the same three are far too small: a step of the tiny transformer is a few hundred kernel
launches of microseconds each, so a GPU run measures launch overhead, not compute or communication
(bf16 is even slower than fp32 there). The ``transformer-*`` family is the same code at the sizes GPUs
are built for - about 27 M, 111 M and 353 M parameters, the last shaped like GPT-2 medium (Radford et
al. 2019: d_model 1024, 24 layers, 16 heads) - with the 25 MiB buckets of DDP's default, which models of
hundreds of MiB of gradients are what it was chosen for. ``dpteach/replica/sizing.py`` picks one for the GPU at
hand; on CPU ranks every lesson keeps the laptop models.

Two rules keep data-parallel runs comparable, number for number, with the single-process reference:

* no dropout: it draws random numbers in every forward, and W ranks would draw different ones
  from one process doing the whole batch;
* no batch norm: its statistics are taken over the *local* batch, so W ranks each normalising 32
  samples compute something different from one process normalising 32*W. LayerNorm and
  GroupNorm look at one sample at a time, so they are safe.

:func:`build_model` creates a model from a seed, identically in every process, which is how each
rank starts from the same weights without a broadcast (the lessons still show the broadcast).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Callable

import torch
from torch import nn

from .. import validate

INPUT_DIM = 64          # MLP: features per sample
NUM_CLASSES = 10        # MLP and CNN: classes to predict
IMAGE_SHAPE = (1, 16, 16)  # CNN: channels, height, width
VOCAB = 64              # transformer: token ids are 0 .. VOCAB-1
SEQ_LEN = 32            # transformer: tokens per input sequence



@dataclass(frozen=True)
class ModelSpec:
    """What the course needs to know about a model besides its code.

    ``lr``: a plain-SGD learning rate at which its loss falls steadily on its data in ``dpteach.replica.data``
    (checked in tests/test_models_data.py); ``bucket_mb``: a bucket cap that gives it several buckets;
    ``batch_per_rank``: the per-rank batch for a GPU-sized model (``None``: the lesson chooses, as for
    the laptop models); ``sized_for``: "cpu" (a laptop's cores) or "gpu".
    """

    name: str
    build: Callable[[], nn.Module]
    lr: float
    bucket_mb: float
    sized_for: str = "cpu"
    batch_per_rank: int | None = None
    vocab: int | None = None  # transformers: token ids are 0 .. vocab-1
    seq_len: int | None = None  # transformers: tokens per input sequence
    d_model: int | None = None
    layers: int | None = None


class MLP(nn.Module):
    """The course's default model: 64 features -> 10 classes through five hidden layers of 512.

    About 1.09M parameters (4.4 MB of float32 gradients) in six Linear layers. Several layers of
    similar size matter for the lessons on buckets and overlap: backward produces gradients last
    layer first, so the gradients of the later layers fill a bucket and can be on the wire while
    the earlier layers are still computing theirs. With one giant layer there would be nothing to
    overlap.
    """

    def __init__(self, input_dim: int = INPUT_DIM, hidden: int = 512, depth: int = 5,
                 num_classes: int = NUM_CLASSES):
        super().__init__()
        layers, width = [], input_dim
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.GELU()]
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)
        # PyTorch's default Linear init draws weights with variance 1/(3*fan_in), which shrinks the
        # signal at every layer; six layers deep, SGD barely moves at first. He initialisation
        # (variance 2/fan_in, made for ReLU, close enough for GELU) keeps the hidden signal at one
        # scale. The output layer keeps the default, so the first logits are small and the first
        # loss is near log(10), the loss of a uniform guess.
        for layer in self.net[:-1]:
            if isinstance(layer, nn.Linear):
                nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
                nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SmallCNN(nn.Module):
    """A three-layer CNN on 1x16x16 images, 10 classes: the "vision" model of the course.

    It shows that nothing in data parallelism depends on the layer type, and it has the typical
    shape of a vision model: the convolutions hold under 5% of the parameters but do about half of
    the compute (each filter slides over every pixel), while the dense head holds the rest of the
    0.55M parameters. Backward meets the head first, so most gradient bytes are ready early and
    the convolutions' backward that follows can hide their communication; the MLP's bytes, by
    contrast, arrive evenly. GroupNorm stands where a vision model would usually have batch norm
    (see the module note).
    """

    def __init__(self, channels: tuple[int, int, int] = (16, 32, 64), hidden: int = 512,
                 num_classes: int = NUM_CLASSES):
        super().__init__()
        c1, c2, c3 = channels
        self.features = nn.Sequential(
            nn.Conv2d(IMAGE_SHAPE[0], c1, 3, padding=1), nn.GroupNorm(8, c1), nn.GELU(),       # 16x16
            nn.Conv2d(c1, c2, 3, stride=2, padding=1), nn.GroupNorm(8, c2), nn.GELU(),         # 8x8
            nn.Conv2d(c2, c3, 3, stride=2, padding=1), nn.GroupNorm(8, c3), nn.GELU(),         # 4x4
        )
        self.head = nn.Sequential(nn.Linear(c3 * 4 * 4, hidden), nn.GELU(), nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class TinyTransformer(nn.Module):
    """A two-layer causal transformer that predicts the next token: the "language model" lesson.

    Vocabulary 64, sequences of 32 tokens, d_model 128, 4 heads, pre-LayerNorm blocks from
    ``nn.TransformerEncoderLayer`` with a causal mask, so position i sees only tokens 0..i.
    It returns logits of shape (batch, SEQ_LEN, VOCAB).

    About 0.29M parameters, in a few large matrices (attention in-projection, feed-forward) and
    many small vectors (biases, norms): the mix where bucketing pays off, since sent one by one
    the small ones cost a message each. The feed-forward width is 2*d_model rather than the usual
    4*d_model, to keep steps short. Every sample is 32 tokens, so per parameter this model
    computes 32 times as much as the MLP: at a per-rank batch of 32, forward and backward take
    several times as long as the all-reduce. That is the compute-bound regime of real language
    models, where overlap can hide communication completely; a per-rank batch of 4-8 sequences
    brings the two back into balance.
    """

    def __init__(self, vocab: int = VOCAB, seq_len: int = SEQ_LEN, d_model: int = 128, heads: int = 4,
                 layers: int = 2, ff_mult: int = 2):
        super().__init__()
        self.token = nn.Embedding(vocab, d_model)
        self.position = nn.Embedding(seq_len, d_model)
        block = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=ff_mult * d_model, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        # True above the diagonal = "may not attend": token i must not see tokens after it.
        mask = torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool), diagonal=1)
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        positions = torch.arange(n, device=tokens.device)
        h = self.token(tokens) + self.position(positions)
        h = self.blocks(h, mask=self.causal_mask[:n, :n], is_causal=True)
        return self.head(self.norm(h))


def _transformer(vocab: int, seq_len: int, d_model: int, heads: int, layers: int, ff_mult: int):
    return partial(TinyTransformer, vocab, seq_len, d_model, heads, layers, ff_mult)


# Learning rates: the laptop models' were found by sweeping (the MLP and CNN on their tasks within 40
# steps of 64 samples; the transformer needs a larger one: with SGD, no Adam, its embeddings and attention
# start slowly). The GPU-sized transformers are deeper and see 8-32 times more tokens per sample, so they
# take smaller ones, the deeper the smaller: with momentum 0.9, 0.1 for 6 layers, 0.03 for 12 and 0.02 for
# 24 took the loss from ln(vocab) to below ln(64) within 20 steps of 4 sequences on the CPU, where 0.1
# diverged for 12 and 24 layers (the 25m model's run is tests/test_models_data.py). Bucket caps: the MLP's and the CNN's gradients are 4.2 and 2.1
# MiB, the tiny transformer's 1.1 MiB, so caps of 1 and 0.25 MiB give each a few buckets, as DDP's 25 MiB
# does for models of hundreds of MiB, which the GPU-sized ones are (105 MiB to 1.3 GiB of gradients).
SPECS = {spec.name: spec for spec in (
    ModelSpec("mlp", MLP, lr=0.05, bucket_mb=1.0),
    ModelSpec("cnn", SmallCNN, lr=0.1, bucket_mb=1.0),
    ModelSpec("transformer", TinyTransformer, lr=0.5, bucket_mb=0.25, vocab=VOCAB, seq_len=SEQ_LEN, d_model=128,
              layers=2),
    ModelSpec("transformer-25m", _transformer(8192, 256, 512, 8, 6, 4), lr=0.1, bucket_mb=25.0, sized_for="gpu",
              batch_per_rank=16, vocab=8192, seq_len=256, d_model=512, layers=6),
    ModelSpec("transformer-110m", _transformer(16384, 1024, 768, 12, 12, 4), lr=0.03, bucket_mb=25.0,
              sized_for="gpu", batch_per_rank=8, vocab=16384, seq_len=1024, d_model=768, layers=12),
    ModelSpec("transformer-350m", _transformer(24576, 1024, 1024, 16, 24, 4), lr=0.02, bucket_mb=25.0,
              sized_for="gpu", batch_per_rank=4, vocab=24576, seq_len=1024, d_model=1024, layers=24),
)}
MODELS = {name: spec.build for name, spec in SPECS.items()}
DEFAULT_LR = {name: spec.lr for name, spec in SPECS.items()}
DEFAULT_BUCKET_MB = {name: spec.bucket_mb for name, spec in SPECS.items()}


LAPTOP_BATCH_PER_RANK = 32  # the laptop models' per-rank batch unless a lesson says otherwise


def default_batch_per_rank(name: str) -> int:
    """The per-rank batch a run of model ``name`` uses unless it is told otherwise."""
    spec = SPECS.get(name)
    return spec.batch_per_rank if spec is not None and spec.batch_per_rank else LAPTOP_BATCH_PER_RANK


def model_names(sized_for: str | None = None) -> list[str]:
    """The names :func:`build_model` accepts, in the order the course introduces them; ``sized_for="cpu"``
    (or "gpu") keeps the models sized for that kind of device."""
    return [name for name, spec in SPECS.items() if sized_for in (None, spec.sized_for)]


def check_model_name(name: str) -> str:
    """Return ``name`` if it names a model, else raise a ``ValueError`` that lists the choices."""
    return validate.choice("model", name, MODELS)


def is_transformer(name: str) -> bool:
    """True for every model of the transformer family (next-token prediction on counting sequences)."""
    return SPECS[name].vocab is not None


def build_model(name: str, seed: int = 0, device: str | torch.device = "cpu") -> nn.Module:
    """Build model ``name`` with weights drawn from ``seed``: the same seed gives the same weights.

    The laptop models are always drawn on the CPU and then moved, so their weights are the same bits
    on every device. A GPU-sized model is drawn on ``device`` itself (filling 350 M parameters on the
    CPU first would take seconds per rank); the same seed gives the same weights on every GPU (CUDA's
    generator is seeded per device), and every rank starts from rank 0's weights anyway
    (``replica.build_replica`` broadcasts them). The global random state of that device is saved and
    restored around the build, so building a model in the middle of a run does not change the random
    numbers the rest of the run sees.
    """
    check_model_name(name)
    validate.integer("seed", seed)
    device = torch.device(device)
    on = device if SPECS[name].sized_for == "gpu" else torch.device("cpu")
    with torch.random.fork_rng(devices=[on] if on.type == "cuda" else []):
        torch.manual_seed(seed)
        with on:
            return MODELS[name]().to(device)


@lru_cache(maxsize=None)
def parameter_count(name: str) -> int:
    """Trainable parameters of model ``name``: a GPU-sized model is counted on the meta device (no memory); a
    laptop model is built on the CPU, which takes milliseconds, where the meta device's first use in a process
    imports torch's Python reference ops first (about a second: a panel's start a learner would wait for)."""
    check_model_name(name)
    on = torch.device("meta") if SPECS[name].sized_for == "gpu" else torch.device("cpu")
    with torch.random.fork_rng(devices=[]), on:  # the caller's random stream is left where it was
        return sum(p.numel() for p in MODELS[name]().parameters() if p.requires_grad)


def parameter_bytes(model: nn.Module) -> int:
    """Bytes of all trainable parameters: the size of the gradient buffer one all-reduce moves."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
