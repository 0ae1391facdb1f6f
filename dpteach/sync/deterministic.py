"""``deterministic``: every gradient element is summed over the ranks in one fixed order, 0, 1, ..., W-1.

The exact strategies end *close* to single-process training (max |dtheta| ~ 1e-7), not equal to it.
The reason is that floating-point addition is not associative. Take three ranks whose gradients
for one weight are, in float32, g0 = 1e8, g1 = -1e8, g2 = 1::

    (g0 + g1) + g2 = 0 + 1    = 1
    g0 + (g1 + g2) = 1e8 - 1e8 = 0     (-1e8 + 1 rounds back to -1e8: float32 spacing there is 8)

An all-reduce fixes no order. A ring starts each chunk's sum at a different rank, so neighbouring
chunks are added in different orders; NCCL chooses ring or tree by message size and topology (gloo runs
its ring at every size).
Every rank still ends with the same bits (the last phase copies one result to all), but not the
bits one process gets, and not necessarily the bits of yesterday's run on another machine.

Making the order a rule makes the result reproducible, and equal to a single process that follows
the same rule. With W=3 and a gradient buffer cut into chunks A, B, C (one per rank)::

    1. every rank:  buffer /= W                   [A0 B0 C0]   [A1 B1 C1]   [A2 B2 C2]
    2. all-to-all:  chunk c of every rank goes to rank c, in rank order
                    rank 0 holds A0 A1 A2,  rank 1 holds B0 B1 B2,  rank 2 holds C0 C1 C2
    3. each rank adds its pieces in rank order:   A = (A0 + A1) + A2, ...
    4. all-gather:  every rank gets A B C

Steps 2 and 4 only copy; step 3 is the only arithmetic, and its order no longer depends on the
algorithm, the chunk or the library. The bytes on the wire are a ring all-reduce's: the all-to-all
is a reduce-scatter whose additions were postponed, each rank sending (W-1)/W of the buffer in each
of the two phases. What it gives up is pipelining the additions with the transfers, and overlap
with backward (it runs after backward, like ``bucketed``).

``train_single_process(config, W, fixed_order=True)`` computes each rank's shard gradient on its own
and adds them the same way: a data-parallel run with this strategy equals it bit for bit (tested;
``dpteach.experiments.determinism`` shows it). On a GPU the kernels must be deterministic too
(``torch.use_deterministic_algorithms``): atomics in some backward kernels add in arrival order.
"""
import torch

from .base import GradientSync


def sum_in_rank_order(pieces: torch.Tensor) -> torch.Tensor:
    """``pieces[0] + pieces[1] + ...`` added left to right: ((p0 + p1) + p2) + ..."""
    total = pieces[0].clone()
    for piece in pieces[1:]:
        total += piece
    return total


def flat_gradient(params) -> torch.Tensor:
    """All of ``params``' gradients in one new flat tensor (zeros for a parameter that got none)."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])


def set_gradients(params, flat: torch.Tensor) -> None:
    """Write ``flat`` (laid out as ``flat_gradient`` lays it) back into every ``.grad``."""
    offset = 0
    for p in params:
        p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
        offset += p.numel()


class DeterministicSync(GradientSync):
    name = "deterministic"

    def __init__(self, model, timeline, **options):
        super().__init__(model, timeline, **options)
        if len({(p.dtype, p.device) for p in self.params}) > 1:
            raise ValueError("strategy='deterministic' needs all parameters in one dtype on one device")
        numel = sum(p.numel() for p in self.params)
        self.chunk = -(-numel // self.world)  # ceil: the buffer is padded to W equal chunks
        self.buffer = torch.zeros(self.chunk * self.world, dtype=self.params[0].dtype,
                                  device=self.params[0].device)

    def finish(self, step: int) -> None:
        flat = flat_gradient(self.params)
        self.buffer[:flat.numel()].copy_(flat)
        self.buffer.div_(self.world)
        with self.comm.exchange():
            mine = torch.empty_like(self.buffer)  # W pieces of my chunk, piece r from rank r
            self.comm.all_to_all_single(mine, self.buffer)
            reduced = sum_in_rank_order(mine.view(self.world, self.chunk))
            self.comm.all_gather_into_tensor(self.buffer, reduced)
        set_gradients(self.params, self.buffer[:flat.numel()])
