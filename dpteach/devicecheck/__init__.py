"""The GPU check: every CUDA path one GPU allows, run in a few minutes and held to named checks.

It sits above the experiments (it runs several lessons' experiments in each of its worlds) and below the
commands: ``dpteach doctor --gpu`` (``commands/doctor.py``) and ``scripts/gpu_check.sh`` run it, and the test
suite runs the same sequence on CPU ranks (``run_device_checks("cpu")``). ``run`` starts the worlds and
gathers the report; ``verdict`` reads each number of the report against what it must be.

Its modules, one line each (``scripts/package_faces.py`` writes this list from their docstrings):

* ``run``: Exercise every CUDA path that one GPU allows, in a few minutes, and say what was measured.
* ``verdict``: What ``dpteach doctor --gpu`` (``run.py``) holds its report to: every check, by name, passed or not.
"""
