"""Profile a learner's own DDP or FSDP job and read its trace (lesson 17): `dpteach profile` records every rank,
`dpteach diagnose` names what slows the job and the lesson that explains it.

Its modules, one line each (``scripts/package_faces.py`` writes this list from their docstrings):

* ``after_import``: Run a function right after a module is first imported, without importing it (``recorder.py``
  needs this: hook torch's optimizer steps in every process that trains, import torch in none that does not).
* ``diagnose``: ``dpteach diagnose TRACE_DIR``: read every rank's trace of a job and say what slows it down, and
  which lesson explains it.
* ``launch``: ``dpteach profile``: run a training command as it is and collect a trace of a few steps from every
  rank.
* ``measures``: Per rank and step: where the time went, and which collectives ran - read from the profiler's own
  events.
* ``merge``: One trace for the whole job: every rank's trace in one file, one process per rank, for Perfetto or
  ``chrome://tracing`` (the "one view of all ranks" that torch.profiler's per-rank files do not give; PyTorch issue
  128292 asks for it).
* ``planted``: A small DDP training script with one problem planted on purpose, to profile and diagnose.
* ``recorder``: Record a few training steps of this process with ``torch.profiler``, without touching the script.
* ``traces``: Read a folder of per-rank ``torch.profiler`` traces, and refuse one that cannot be diagnosed, saying
  why.
* ``boot/``: Holds ``sitecustomize.py``: the folder ``dpteach profile`` puts first on the command's ``PYTHONPATH``.
"""
from .launch import profile_command, torchrun
from .recorder import record_steps

__all__ = ["profile_command", "record_steps", "torchrun"]
