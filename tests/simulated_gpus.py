"""Machines the suite makes torch report on a machine without GPUs: the GPUs learners have.

``simulate(kind, setattr)`` patches ``torch.cuda`` (and NCCL's availability) so that torch reports the GPUs of
``kind`` - their names, compute capabilities, memory and the peer access between each pair - and the course's
own reading of the topology (``dpteach.ranks.gpus.read_topology``) returns what ``nvidia-smi topo -m`` would. No
kernel can run on them: the tests that use this read facts, choose placements and record launches.

``setattr`` is pytest's ``monkeypatch.setattr`` in a test (undone after it) or the builtin in a kernel.
"""
from __future__ import annotations

from types import SimpleNamespace

GiB = 2**30

# name, capability, memory (what total_memory reports), peer access, the topology matrix's GPU-to-GPU entry, and
# the fp32 rate the course's model sizing would measure (NVIDIA's datasheets: T4 8.1, A100 19.5, H100 SXM 67,
# RTX 4090 82.6 TFLOP/s; dpteach.replica.sizing measures it with TF32 off)
MACHINES = {
    # Kaggle's free pair: "peer access is not supported between these two devices"
    "2xT4": dict(gpus=2, name="Tesla T4", capability=(7, 5), memory=15 * GiB, peer=False, topo=None, tflops=8.1),
    # Colab's free tier: one GPU per runtime
    "1xT4": dict(gpus=1, name="Tesla T4", capability=(7, 5), memory=15 * GiB, peer=False, topo=None, tflops=8.1),
    # an eight-GPU NVLink node
    "8xA100": dict(gpus=8, name="NVIDIA A100-SXM4-80GB", capability=(8, 0), memory=79 * GiB, peer=True, topo="NV12",
                   tflops=19.5),
    "1xH100": dict(gpus=1, name="NVIDIA H100 80GB HBM3", capability=(9, 0), memory=79 * GiB, peer=True, topo=None,
                   tflops=67.0),
    # a rented consumer pair whose driver still offers peer access over PCIe
    "2xRTX4090": dict(gpus=2, name="NVIDIA GeForce RTX 4090", capability=(8, 9), memory=23 * GiB, peer=True,
                      topo="PHB", tflops=82.6),
}


def simulate(kind: str, setattr=setattr, initialised: bool = False) -> dict:
    """Make torch report the machine ``kind``; ``initialised``: as if this process had already used CUDA."""
    import torch
    import torch.distributed as dist

    import dpteach.ranks.gpus

    spec = MACHINES[kind]
    count = spec["gpus"]

    def props(device=None):
        index = 0 if device is None else int(getattr(device, "index", device) or 0)
        if not 0 <= index < count:
            raise AssertionError(f"invalid device ordinal {index}")
        major, minor = spec["capability"]
        return SimpleNamespace(name=spec["name"], major=major, minor=minor, total_memory=spec["memory"],
                               multi_processor_count=40)

    setattr(torch.cuda, "is_available", lambda: True)
    setattr(torch.cuda, "device_count", lambda: count)
    setattr(torch.cuda, "get_device_properties", props)
    setattr(torch.cuda, "get_device_name", lambda device=None: props(device).name)
    setattr(torch.cuda, "get_device_capability", lambda device=None: (props(device).major, props(device).minor))
    setattr(torch.cuda, "can_device_access_peer", lambda i, j: spec["peer"] and i != j)
    setattr(torch.cuda, "is_initialized", lambda: initialised)
    setattr(torch.cuda.nccl, "version", lambda: (2, 27, 3))
    setattr(dist, "is_nccl_available", lambda: True)
    topo = None if spec["topo"] is None else tuple(tuple("X" if i == j else spec["topo"] for j in range(count))
                                                   for i in range(count))
    setattr(dpteach.ranks.gpus, "read_topology", lambda n: topo if n == count else None)
    return spec
