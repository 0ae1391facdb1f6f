"""dpteach: data-parallel training, taught by running it.

The pieces, bottom to top (see the README's map):

* :func:`launch` runs a function on W real ranks (gloo on CPU, NCCL on GPUs, or joins ``torchrun``);
* :mod:`dpteach.collectives` builds all-reduce from send/recv, step by step;
* :mod:`dpteach.network.costmodel` predicts collective times with the alpha-beta model.

Its modules, one line each (``scripts/package_faces.py`` writes this list from their docstrings):

* ``__main__``: ``python -m dpteach ...`` is the ``dpteach`` command, for environments where scripts are not on
  PATH.
* ``cli``: The ``dpteach`` command: ``dpteach <subcommand> --help`` for each.
* ``course``: The course in one table: its lessons, what each one runs, and which exercises go with it.
* ``front_end``: Does the front end draw widgets? If not, a panel leaves its results as plain outputs of the cell.
* ``materials``: Where the course's own files are: the lessons, the exercises and the quiz bank.
* ``measure``: How the course compares measured times: interleaved, repeated, a median with an interval, and a
  ranking only where the intervals separate.
* ``progress``: The learner's progress through the course: quiz answers, exercise grades and predictions, in one
  JSON file.
* ``units``: How the course writes a number of bytes: binary units (KiB, MiB, GiB), in tables, axes and sentences
  alike.
* ``validate``: Argument checks for the course's public entry points, in one voice.
* ``workspace``: A learner's own copy of the course, for a course installed with pip.
* ``collectives/``: Collectives written with point-to-point messages only, to be read next to notebook 02.
* ``commands/``: One module per ``dpteach`` subcommand.
* ``devicecheck/``: The GPU check: every CUDA path one GPU allows, run in a few minutes and held to named checks.
* ``experiments/``: One function per lesson: each runs real ranks and returns plain data (dicts and lists).
* ``grading/``: Exercises that grade themselves by running the learner's code on real multi-rank worlds.
* ``network/``: The network and its cost: what a link is, what a collective costs on it, and how one is sent.
* ``profiling/``: Profile a learner's own DDP or FSDP job and read its trace (lesson 17): `dpteach profile` records
  every rank, `dpteach diagnose` names what slows the job and the lesson that explains it.
* ``quiz/``: Quizzes in the style of certification practice questions, each option explained, each answer shown
  live.
* ``ranks/``: Running ranks: where a world's processes come from and what each one knows.
* ``replica/``: One rank's replica: what it trains and what it records on the way.
* ``sync/``: Gradient-sync strategies, one small file each, to be read next to the notebooks.
* ``training/``: Training with a strategy, and what a run is held to.
* ``widgets/``: ipywidgets panels for the notebooks: controls, a Run button, and an output area.
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
