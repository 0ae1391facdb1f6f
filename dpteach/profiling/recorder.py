"""Record a few training steps of this process with ``torch.profiler``, without touching the script.

A training step has no name a profiler could find on its own, but nearly every training loop calls
``optimizer.step()`` once per step. So the recorder hangs on torch's *global* optimizer hook
(``torch.optim.optimizer.register_optimizer_step_post_hook``, called after every optimizer's step): the
first step starts a profiler, each later one marks a step boundary (``prof.step()``, which writes the
``ProfilerStep#N`` spans the diagnosis cuts the trace with), and after ``skip`` steps of warm-up and
``steps`` recorded steps it writes this rank's trace and stops. Steps before are the script's own
warm-up (the first step builds DDP's buckets and the optimizer's state; it is never typical).

Every rank counts the same optimizer steps, so all ranks record the same steps: their collectives can be
matched one to one (``diagnose.py``). The file is ``rank{R}.json`` in the output folder, in the layout
Holistic Trace Analysis reads (one trace per rank, one folder; the rank is also in the trace's
``distributedInfo``, which torch.profiler adds when a process group exists). It is written to a
temporary name and renamed, so a folder never holds half a trace.

Two ways in:

* ``dpteach profile -- torchrun ... train.py`` (``launch.py``) puts ``boot/sitecustomize.py`` on the
  ``PYTHONPATH`` of the command, and every Python process it starts calls :func:`install_from_environment`;
* where the launch cannot be wrapped, two lines at the top of the script do the same::

      from dpteach.profiling import record_steps
      record_steps("traces")        # steps=5, skip=3
"""
from __future__ import annotations

import atexit
import os

from .. import validate

ENV_DIR, ENV_STEPS, ENV_SKIP = "DPTEACH_PROFILE_DIR", "DPTEACH_PROFILE_STEPS", "DPTEACH_PROFILE_SKIP"


def trace_name(rank: int) -> str:
    return f"rank{rank}.json"


class StepRecorder:
    """Driven by optimizer steps: ``skip`` steps untouched, one warm-up step, ``steps`` recorded, then written."""

    def __init__(self, folder: str, steps: int = 5, skip: int = 3):
        self.folder, self.steps, self.skip = os.path.abspath(folder), steps, skip
        self.profiler, self.seen, self.written = None, 0, None

    def after_optimizer_step(self, optimizer=None, args=None, kwargs=None) -> None:
        self.seen += 1
        if self.written is not None:
            return
        if self.profiler is None:
            self._start()
        else:
            self.profiler.step()

    def _start(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            activities.append(ProfilerActivity.CUDA)
        # wait=skip steps, warmup=1 (the profiler's own start-up cost lands there), then `steps` recorded
        self.profiler = profile(activities=activities, record_shapes=True, on_trace_ready=self._write,
                                schedule=schedule(wait=self.skip, warmup=1, active=self.steps, repeat=1))
        self.profiler.start()
        atexit.register(self.finish)

    def _write(self, profiler) -> None:
        rank = _rank()
        os.makedirs(self.folder, exist_ok=True)
        final = os.path.join(self.folder, trace_name(rank))
        partial = f"{final}.{os.getpid()}.partial"
        profiler.export_chrome_trace(partial)
        os.replace(partial, final)
        self.written = final

    def finish(self) -> None:
        """Stop the profiler (at exit, or once the trace is written); a run too short leaves no trace."""
        profiler, self.profiler = self.profiler, None
        if profiler is not None:
            try:
                profiler.stop()
            except RuntimeError:  # already stopped by its schedule
                pass


def _rank() -> int:
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def record_steps(folder: str = "traces", steps: int = 5, skip: int = 3) -> StepRecorder:
    """Record ``steps`` optimizer steps of this process after ``skip`` (+1 warm-up) into ``folder/rank{R}.json``."""
    validate.integer("steps", steps, low=1, high=100, why=" (a few steps describe a job; traces grow fast)")
    validate.integer("skip", skip, low=0)
    import torch.optim.optimizer as optimizer_module
    recorder = StepRecorder(folder, steps, skip)
    optimizer_module.register_optimizer_step_post_hook(recorder.after_optimizer_step)
    return recorder


def install_from_environment() -> None:
    """Called by ``boot/sitecustomize.py`` in every process ``dpteach profile`` starts: if this process ever
    imports ``torch.optim``, hook its optimizer steps (without importing torch here: the launcher and any
    helper process that never trains stay as they were)."""
    folder = os.environ.get(ENV_DIR)
    if not folder:
        return
    steps, skip = int(os.environ.get(ENV_STEPS, "5")), int(os.environ.get(ENV_SKIP, "3"))
    from .after_import import call_after_import
    call_after_import("torch.optim.optimizer", lambda _module: record_steps(folder, steps, skip))
