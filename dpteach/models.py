"""Three small models that every lesson trains: an MLP, a CNN and a tiny transformer.

They are defined here in code, so nothing is downloaded, and they are sized for a laptop: for the
MLP and the CNN, on one CPU thread, a forward and backward pass over a per-rank batch of 32 samples
takes about as long as a gloo all-reduce of all their gradients between 2-4 local processes (a few
milliseconds each). That balance is what makes the course's questions interesting: if compute
dwarfed communication, no synchronisation strategy would matter; if communication dwarfed compute,
overlap could hide little. The transformer shows the compute-heavy side (see its note).

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

import torch
from torch import nn

from . import validate

INPUT_DIM = 64          # MLP: features per sample
NUM_CLASSES = 10        # MLP and CNN: classes to predict
IMAGE_SHAPE = (1, 16, 16)  # CNN: channels, height, width
VOCAB = 64              # transformer: token ids are 0 .. VOCAB-1
SEQ_LEN = 32            # transformer: tokens per input sequence

# Plain-SGD learning rates at which each model's loss falls steadily on its data in `dpteach.data`
# (by more than 30% within 40 steps of 64 samples, checked in tests/test_models_data.py). The
# transformer needs a larger one: with SGD (no Adam) its embeddings and attention start slowly.
DEFAULT_LR = {"mlp": 0.05, "cnn": 0.1, "transformer": 0.5}

# Bucket caps (MiB) that give each model a few buckets, as DDP's 25 MiB does for models of hundreds of
# MiB: with one or two buckets there would be nothing to launch while backward runs. The MLP's and
# the CNN's gradients are 4.2 and 2.1 MiB, the transformer's 1.1 MiB.
DEFAULT_BUCKET_MB = {"mlp": 1.0, "cnn": 1.0, "transformer": 0.25}


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
                 layers: int = 2):
        super().__init__()
        self.token = nn.Embedding(vocab, d_model)
        self.position = nn.Embedding(seq_len, d_model)
        block = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=2 * d_model, dropout=0.0,
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


MODELS = {"mlp": MLP, "cnn": SmallCNN, "transformer": TinyTransformer}


def model_names() -> list[str]:
    """The names :func:`build_model` accepts, in the order the course introduces them."""
    return list(MODELS)


def check_model_name(name: str) -> str:
    """Return ``name`` if it names a model, else raise a ``ValueError`` that lists the choices."""
    return validate.choice("model", name, MODELS)


def build_model(name: str, seed: int = 0) -> nn.Module:
    """Build model ``name`` with weights drawn from ``seed``: the same seed gives the same weights.

    The global random state is saved and restored around the build, so building a model in the
    middle of a run does not change the random numbers the rest of the run sees.
    """
    check_model_name(name)
    validate.integer("seed", seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MODELS[name]()


def parameter_bytes(model: nn.Module) -> int:
    """Bytes of all trainable parameters: the size of the gradient buffer one all-reduce moves."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
