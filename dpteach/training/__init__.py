"""Training with a strategy, and what a run is held to.

``train`` is the lockstep loop, read top to bottom; ``reference`` the single-process run every strategy's
result is compared with; ``accounting`` where a step's time went (compute, communication waited for, overhead).
These sit above the strategies (``dpteach.sync``); the experiments sit above them.

Its modules, one line each (``scripts/package_faces.py`` writes this list from their docstrings):

* ``accounting``: Where a data-parallel step's time goes: compute, communication waited for, and overhead, by name.
* ``batch_rules``: How big a batch: the learning-rate rules, the gradient noise scale, and the steps a batch size
  costs.
* ``checkpoint``: A checkpoint that resumes a run exactly: what it must hold, written by every rank, read at any W.
* ``fault_tolerant``: One replica group of a job that survives a failure without a restart, with torchft
  (github.com/pytorch/torchft).
* ``interval``: How often to checkpoint: the interval that loses the least time, by formula and by simulation.
* ``prologue``: What every training experiment settles once, before its ranks start: the world, the link, the model.
* ``reference``: The single-process reference every data-parallel strategy is held to.
* ``resumable``: A training run that survives its own death: checkpoint every N steps, resume from the newest one.
* ``target``: Time to a target loss: the one measure that is fair to a method that sends less.
* ``train``: The training loop every lockstep strategy runs in, read top to bottom.
"""
