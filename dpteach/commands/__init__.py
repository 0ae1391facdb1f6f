"""One module per ``dpteach`` subcommand.

Its modules, one line each (``scripts/package_faces.py`` writes this list from their docstrings):

* ``autograder``: ``dpteach autograder``: write a Gradescope autograder for one exercise.
* ``batch_size``: ``dpteach batch-size``: how big a batch - the critical batch size and the learning-rate rules, on
  real ranks.
* ``bench``: ``dpteach bench allreduce``: the all-reduce sweep (algbw and busbw as in nccl-tests), as a table or as
  JSON.
* ``compare``: ``dpteach compare``: every gradient-sync strategy on one model, measured in one run.
* ``diagnose``: ``dpteach diagnose TRACE_DIR``: what slows the job whose per-rank traces are in TRACE_DIR, each
  finding with the lesson that explains it (``dpteach.profiling.diagnose``); ``--merge`` writes one trace of all
  ranks.
* ``doctor``: ``dpteach doctor``: what this machine offers, which backend the course will use, and a smoke test.
* ``grade``: ``dpteach grade``: grade an exercise notebook in the terminal, the same way ``check()`` does in the
  notebook.
* ``lab``: ``dpteach lab``: open JupyterLab on the course's first notebook.
* ``profile``: ``dpteach profile [--steps N] [--skip K] [--out DIR] -- COMMAND ...``: record a few steps of every
  rank of a training command, unedited, into one folder of per-rank traces (``dpteach.profiling.launch``).
* ``progress``: ``dpteach progress``: how far the learner is - quiz items per topic and exercise grades.
* ``quiz``: ``dpteach quiz``: take a quiz in the terminal, check the bank, list it, or score an answers file.
* ``train``: ``dpteach train``: one strategy, checkpointed every N steps, resumed from the newest checkpoint if
  there is one.
* ``workspace``: ``dpteach workspace``: your copy of the course against the version in the installed package.
"""
