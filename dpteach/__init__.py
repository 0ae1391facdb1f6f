"""dpteach: data-parallel training, taught by running it.

The pieces, bottom to top (see the README's map):

* :func:`launch` runs a function on W real ranks (gloo on CPU, NCCL on GPUs, or joins ``torchrun``);
* :mod:`dpteach.collectives` builds all-reduce from send/recv, step by step;
* :mod:`dpteach.costmodel` predicts collective times with the alpha-beta model.
"""
from .context import default_world_size, device, rank, report_progress, world_size
from .launcher import RankError, launch, under_torchrun

__version__ = "0.1.0"
__all__ = ["default_world_size", "launch", "RankError", "under_torchrun", "device", "report_progress", "rank", "world_size"]
