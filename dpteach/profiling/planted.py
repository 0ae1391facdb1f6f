"""A small DDP training script with one problem planted on purpose, to profile and diagnose.

Run it the way a real job runs, under torchrun, and profile it with ``dpteach profile``::

    dpteach profile --out traces -- torchrun --nproc-per-node 4 -m dpteach.profiling.planted --plant slow-loader
    dpteach diagnose traces

``--plant`` picks the problem (each is a mistake real jobs make; ``diagnose.py`` says how it shows):

* ``healthy``: DDP with its defaults, nothing planted.
* ``tiny-buckets``: ``bucket_cap_mb`` of 0.02 MiB: one all-reduce per layer (25 of about 64 KiB) instead of two
  buckets per step (lesson 03).
* ``no-overlap``: no DDP; the gradients are flattened and all-reduced once, after backward, while the
  rank does nothing else - the hand-written loop that waits for the network every step (lesson 04).
* ``slow-loader``: the last rank's dataset takes ``--slow-ms`` per batch to produce (a slow disk, a heavy
  decode); every other rank waits for it at the first all-reduce (lesson 08).
* ``slow-rank``: the last rank computes ``--slow-ms`` longer every step (a slower or busier device); the
  others wait for it (lesson 07's straggler).
* ``unused-layers``: the model has a branch its forward never uses, so DDP needs
  ``find_unused_parameters=True``, which makes it search the graph after every forward and all-reduce a map
  of the used parameters (lesson 03).

On a GPU machine the model and batches go to the rank's GPU and the process group is NCCL; elsewhere
gloo on CPU.
"""
from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

PLANTS = ("healthy", "tiny-buckets", "no-overlap", "slow-loader", "slow-rank", "unused-layers")


class Batches(torch.utils.data.Dataset):
    """Random inputs and labels, a fixed number per rank; ``delay_s`` per item models a slow source."""

    def __init__(self, length: int, width: int, classes: int, seed: int, delay_s: float = 0.0):
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(length, width, generator=generator)
        self.y = torch.randint(0, classes, (length,), generator=generator)
        self.delay_s = delay_s

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.x[i], self.y[i]


class Model(nn.Module):
    def __init__(self, width: int, depth: int, classes: int, unused_branch: bool):
        super().__init__()
        self.body = nn.Sequential(*[layer for _ in range(depth) for layer in (nn.Linear(width, width), nn.ReLU())])
        self.head = nn.Linear(width, classes)
        # an auxiliary branch (left from another task, say) that forward never calls: no gradient reaches it
        self.spare = nn.Sequential(*[nn.Linear(width, width) for _ in range(4)]) if unused_branch else None

    def forward(self, x):
        return self.head(self.body(x))


def busy_for(seconds: float, device) -> None:
    """Compute, not sleep, for ``seconds``: what a slower device looks like in a trace."""
    a = torch.randn(128, 128, device=device)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = torch.tanh(a @ a)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--plant", choices=PLANTS, default="healthy")
    parser.add_argument("--steps", type=int, default=12, help="training steps (default 12)")
    parser.add_argument("--slow-ms", type=float, default=40.0, help="what slow-loader and slow-rank add per step")
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--depth", type=int, default=24)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.slow_ms < 0:
        parser.error(f"--steps={args.steps} must be >= 1 and --slow-ms={args.slow_ms} >= 0")

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    last = rank == world - 1
    torch.manual_seed(0)
    model = Model(args.width, args.depth, 10, unused_branch=args.plant == "unused-layers").to(device)
    if args.plant == "no-overlap":
        for p in model.parameters():  # what DDP's constructor would do: start from rank 0's weights
            dist.broadcast(p.data, 0)
        trained = model
    else:
        options = {"tiny-buckets": {"bucket_cap_mb": 0.02},
                   "unused-layers": {"find_unused_parameters": True}}.get(args.plant, {})
        trained = DDP(model, device_ids=[device.index] if cuda else None, **options)
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.01, momentum=0.9)
    delay = args.slow_ms / 1000 / args.batch if args.plant == "slow-loader" and last else 0.0
    data = Batches(args.batch * args.steps, args.width, 10, seed=rank, delay_s=delay)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch)

    for x, y in loader:
        x, y = x.to(device), y.to(device)
        if args.plant == "slow-rank" and last:
            busy_for(args.slow_ms / 1000, device)
        loss = nn.functional.cross_entropy(trained(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if args.plant == "no-overlap":
            grads = [p.grad for p in model.parameters()]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)  # after backward: nothing else runs while it is on the wire
            flat /= world
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        optimizer.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
