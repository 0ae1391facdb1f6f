"""Training with a strategy, and what a run is held to.

``train`` is the lockstep loop, read top to bottom; ``reference`` the single-process run every strategy's
result is compared with; ``accounting`` where a step's time went (compute, communication waited for, overhead).
These sit above the strategies (``dpteach.sync``); the experiments sit above them.
"""
