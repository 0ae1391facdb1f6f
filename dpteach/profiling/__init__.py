"""Profile a learner's own DDP or FSDP job and read its trace (lesson 17).

* ``recorder.py``: record a few optimizer steps of each rank with ``torch.profiler`` (``record_steps``);
* ``launch.py``: ``dpteach profile -- torchrun ...``, the same without editing the script;
* ``traces.py``: read and check a folder of per-rank traces;
* ``measures.py``: per rank and step, what the time went to and which collectives ran;
* ``diagnose.py``: the findings, each with the lesson that explains it;
* ``merge.py``: one trace with a process per rank, for Perfetto or ``chrome://tracing``;
* ``planted.py``: the course's small DDP script with a problem planted on purpose.
"""
from .launch import profile_command, torchrun
from .recorder import record_steps

__all__ = ["profile_command", "record_steps", "torchrun"]
