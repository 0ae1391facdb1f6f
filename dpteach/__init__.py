"""dpteach: data-parallel training, taught by running it.

The pieces, bottom to top (see the README's map):

* :func:`launch` runs a function on W real ranks (gloo on CPU, NCCL on GPUs, or joins ``torchrun``);
* :mod:`dpteach.collectives` builds all-reduce from send/recv, step by step;
* :mod:`dpteach.network.costmodel` predicts collective times with the alpha-beta model.
"""
import importlib

__version__ = "0.1.0"

# name -> the module that defines it. Imported on first use, so that ``dpteach --help`` and the
# quiz do not pay for importing torch.
_EXPORTS = {
    "launch": "ranks.launcher", "RankError": "ranks.launcher",
    "World": "ranks.world", "resolve_world": "ranks.world", "default_world_size": "ranks.world",
    "under_torchrun": "ranks.torchrun", "device": "ranks.context", "report_progress": "ranks.context",
    "rank": "ranks.context", "world_size": "ranks.context",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dpteach' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_EXPORTS])
