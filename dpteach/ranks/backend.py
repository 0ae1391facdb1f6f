"""Which backend and device a world of W ranks uses.

The rule the whole course follows, "device follows backend":

* NCCL, one GPU per rank, when there are at least W visible GPUs. NCCL refuses two ranks on one
  GPU, so it is never chosen for W > number of GPUs.
* gloo otherwise. gloo runs on CPU tensors; when a GPU is present the ranks may still compute on it
  (rank r uses GPU r mod G) and the collectives stage their buffers through host memory.

Everything here is checked *before* any process starts, so a wrong argument is a ``ValueError`` that
names the argument, its value and what is allowed.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .. import validate

BACKENDS = ("auto", "gloo", "nccl")
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class Placement:
    """The backend a world uses and the device each rank computes on."""

    backend: str
    device_type: str  # "cpu" or "cuda"
    gpus: int
    shared_gpu: bool = False  # NCCL ranks sharing GPUs, for correctness checks only (nccl_may_share_gpus)

    @property
    def process_group_backend(self) -> str:
        """What ``init_process_group`` is given. NCCL moves CUDA tensors only, yet every world also
        runs small collectives on CPU tensors (shape checks, loss averages, the replica check), so an
        NCCL world carries gloo too and torch sends each collective to the backend of its tensors'
        device. Without it those calls fail with "No backend type associated with device type cpu"."""
        return "cpu:gloo,cuda:nccl" if self.backend == "nccl" else self.backend

    def device_for(self, local_rank: int) -> str:
        if self.device_type == "cuda":
            return f"cuda:{local_rank % self.gpus}"
        return "cpu"

    def rank_env(self, rank: int, world_tag: str) -> dict:
        """Environment variables rank ``rank`` needs beyond the usual ones (only shared-GPU NCCL has any)."""
        if not self.shared_gpu:
            return {}
        # A host id of its own per rank (NCCL's getHostHash reads NCCL_HOSTID): NCCL then takes the
        # ranks for separate machines, skips its "same GPU on one host" refusal, and connects them
        # with its socket transport over the loopback interface, as it would connect two nodes.
        return {"NCCL_HOSTID": f"dpteach-{world_tag}-rank{rank}", "NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "lo",
                "NCCL_IB_DISABLE": "1"}

    def oversubscribed(self, local_ranks: int) -> bool:
        """True when ``local_ranks`` ranks on one machine must share its devices: more ranks than
        GPUs (they time-slice each GPU) or, on CPU, more ranks than cores. Their step times then
        measure the sharing as much as the communication, and the lessons say so."""
        if self.device_type == "cuda":
            return local_ranks > self.gpus
        return local_ranks > cores_available()

    def describe_sharing(self, local_ranks: int) -> str | None:
        """One sentence for a learner when ranks share devices; None when each has its own."""
        if not self.oversubscribed(local_ranks):
            return None
        if self.device_type == "cuda":
            per = -(-local_ranks // self.gpus)
            return (f"{local_ranks} ranks share {self.gpus} GPU(s), up to {per} per GPU: the GPU runs one rank's "
                    f"kernels at a time (time-slicing), so a step time measures the ranks taking turns, not "
                    f"W GPUs working at once; the results (weights, losses, bytes sent) are unaffected")
        return (f"{local_ranks} ranks share {cores_available()} CPU core(s): the ranks take turns, so a step time "
                f"measures the sharing as much as the communication; the results are unaffected")


def backend_for(device_type: str, group=None) -> str:
    """Inside a world: the backend that moves ``device_type`` tensors ("gloo" or "nccl")."""
    return backend_in(dist.get_backend_config(group), device_type)


def backend_in(config: str, device_type: str) -> str | None:
    """The backend a backend config (``"cpu:gloo,cuda:nccl"``; plain "gloo" reads "cpu:gloo,cuda:gloo")
    names for ``device_type``, or None when it names none."""
    if ":" not in config:
        return config
    return dict(item.split(":") for item in config.split(",")).get(device_type)


def use_device(device: str) -> None:
    """Make ``device`` this rank's device before it joins a world (NCCL needs the current GPU set).

    On a GPU it also turns TF32 off: cuDNN convolutions default to TF32 on recent GPUs, which rounds
    their inputs to 10 mantissa bits and moves a CNN's gradients by about 1e-3 (relative), far more
    than the 1e-5 within which the course holds every exact strategy to fp32 single-process
    training. The lesson is about communication, so arithmetic stays plain fp32.
    """
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


@contextmanager
def plain_fp32(device: str):
    """TF32 off inside the block, as in every GPU rank (:func:`use_device`), and put back afterwards:
    for a reference computed in the learner's own process, whose settings are the learner's."""
    if not str(device).startswith("cuda"):
        yield
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def open_nccl_communicator(device: str) -> None:
    """Right after joining an NCCL world, all-reduce one number on the GPU, on every rank.

    NCCL builds its communicator on the first CUDA collective, and that first call must involve
    every rank: a batched point-to-point call that touches only some of them (the tree's first
    level does) is undefined as a first call (``torch.distributed.batch_isend_irecv``'s note). It
    also keeps the communicator's set-up time out of the first measured step.
    """
    if device.startswith("cuda") and backend_for("cuda") == "nccl":
        dist.all_reduce(torch.zeros(1, device=device))
        torch.cuda.synchronize(device)


def visible_gpus() -> int:
    """The GPUs the course may use: those torch sees, capped by ``DPTEACH_GPUS`` when it is set.

    ``DPTEACH_GPUS=0`` runs the whole course on CPU ranks on a machine with GPUs (the test suite
    does this for every test not marked ``gpu``, so that its results do not depend on the machine);
    ``DPTEACH_GPUS=2`` keeps worlds to two of eight GPUs. It can only lower the count: to hide GPUs
    from torch itself, set ``CUDA_VISIBLE_DEVICES`` before Python starts.
    """
    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cap = os.environ.get("DPTEACH_GPUS", "").strip()
    if not cap:
        return found
    if not cap.isdigit():
        raise ValueError(f"DPTEACH_GPUS={cap!r} is not allowed: it must be a whole number of GPUs >= 0 "
                         f"(0 runs every rank on the CPU), or unset")
    return min(found, int(cap))


def cores_available() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cores_of_rank(rank: int, world_size: int, device_type: str) -> list[int] | None:
    """The cores a CPU rank runs on when each can have its own (Linux), as a GPU rank has its GPU: an
    equal block of the cores this process may use (W=1 on 8 cores: all 8; W=4: two each). None where
    the ranks must share (more ranks than cores, GPU ranks, no affinity masks).

    Left free, the scheduler wakes a rank's gloo threads on its peer's core and stalls the peer's
    backward, and the overlap strategies lose much of what they hide (``benchmarks/README.md``).
    """
    if device_type != "cpu" or not hasattr(os, "sched_getaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if world_size > len(allowed):
        return None
    per_rank = len(allowed) // world_size
    return allowed[rank * per_rank:(rank + 1) * per_rank]


def nccl_available() -> bool:
    return dist.is_available() and dist.is_nccl_available()


def gloo_available() -> bool:
    return dist.is_available() and dist.is_gloo_available()


def choose_placement(world_size: int, backend: str = "auto", device: str = "auto") -> Placement:
    """Pick backend and device for ``world_size`` ranks on this machine, or explain why not."""
    validate.integer("world_size", world_size, low=1)
    validate.choice("backend", backend, BACKENDS)
    validate.choice("device", device, DEVICES)
    gpus = visible_gpus()
    if device == "cuda" and gpus == 0:
        raise ValueError("device='cuda' is not allowed here: this machine has no visible CUDA device "
                         "(use device='cpu' or 'auto')")
    if backend == "auto":
        backend = "nccl" if (gpus >= world_size and device != "cpu" and nccl_available()) else "gloo"
    if backend == "nccl":
        if device == "cpu":
            raise ValueError("backend='nccl' with device='cpu' is not allowed: NCCL only moves CUDA "
                             "tensors (use backend='gloo' for CPU ranks)")
        if not nccl_available() or gpus == 0:
            raise ValueError("backend='nccl' is not allowed here: NCCL needs CUDA GPUs and this machine "
                             "has none (use backend='gloo' or 'auto')")
        if world_size > gpus and nccl_may_share_gpus():
            return Placement("nccl", "cuda", gpus, shared_gpu=True)
        if world_size > gpus:
            raise ValueError(f"backend='nccl' with world_size={world_size} is not allowed: NCCL needs one "
                             f"GPU per rank and {gpus} GPU(s) are visible (use world_size <= {gpus}; "
                             f"backend='gloo', whose ranks may share GPUs; or peers='emulated', one rank on one "
                             f"GPU whose link times the exchange of W ranks)")
        return Placement("nccl", "cuda", gpus)
    if not gloo_available():
        raise ValueError("backend='gloo' is not available in this torch build")
    if device == "auto":
        device = "cuda" if gpus else "cpu"
    return Placement("gloo", device, gpus)


SHARED_GPU_SWITCH = "DPTEACH_NCCL_SHARED_GPU"


def nccl_may_share_gpus() -> bool:
    """True when ``DPTEACH_NCCL_SHARED_GPU=1``: NCCL worlds that ``launch`` starts may put several ranks
    on one GPU - for checking correctness on one GPU, never for timing (``dpteach doctor --gpu`` sets it
    for its shared-GPU worlds).

    NCCL refuses two ranks of one machine on one GPU (its ``init.cc`` compares host hashes and GPU
    ids). Given a host id of its own (``NCCL_HOSTID``, read by NCCL's ``getHostHash``), each rank
    looks like a separate machine, and NCCL connects them with its socket transport over the loopback
    interface, as it would connect two nodes. Every NCCL code path - batched point-to-point,
    collectives launched from autograd hooks, every dtype - then runs for real; the timings mean
    nothing (the ranks take turns on the GPU and talk over sockets, not NVLink).
    """
    return os.environ.get(SHARED_GPU_SWITCH, "") == "1"
