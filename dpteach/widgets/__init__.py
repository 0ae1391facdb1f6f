"""ipywidgets panels for the notebooks: controls, a Run button, and an output area.

Panels hold no training logic: the Run button calls a function of ``dpteach.experiments`` with the
controls' values and hands the plain-data result to a render function (plots, small tables).

A notebook that imports the panels is about to launch ranks: the zygote they are forked from
(``dpteach/ranks/zygote.py``) starts importing torch now, beside the notebook's own imports, rather than
at the first Run.

Its modules, one line each (``scripts/package_faces.py`` writes this list from their docstrings):

* ``accumulation``: Plots and tables for ``notebooks/05_accumulation.ipynb`` (data from
  ``dpteach.experiments.accumulation_sweep``).
* ``asynchronous``: Plots and tables for ``notebooks/07_sync_vs_async.ipynb`` (data from
  ``dpteach.experiments.async_staleness``).
* ``batch_size``: Tables and plots for lesson 15: activation memory and checkpointing, the learning-rate rules, the
  critical batch size, and lesson 09's scaling judged by time to a target loss.
* ``bucketing``: Plots and tables for lesson 03: bucket assignments and the bucket-size sweep.
* ``capture``: Show what a block of code prints and displays inside an ``ipywidgets.Output``, written by the kernel.
* ``collectives``: Plots and widgets for lesson 02: the collectives, a step-by-step trace player, the alpha-beta
  model.
* ``compression``: Plots and tables for ``notebooks/06_compression.ipynb`` (data from
  ``dpteach.experiments.compression_tradeoff`` and ``compression_bytes``).
* ``controls``: Controls whose readout is exactly the value the experiment receives.
* ``ddp_in_practice``: Plots and tables for what DDP and the data really do: lessons 02 (a mismatched collective),
  03 (DDP's own buckets, unused parameters, bucket views) and 08 (a forgotten sampler, uneven inputs).
* ``diagnosis``: Lesson 17's view of a diagnosis: where each rank's median step went, and the findings with their
  lessons.
* ``exam``: Tables for ``notebooks/10_practice_exam.ipynb``: which notebook proves each answer, and the learner's
  progress.
* ``failures``: Tables and plots for lesson 13: what the peers of a failed rank saw, a restart, resumes, checkpoint
  costs and the checkpoint interval.
* ``figure_text``: What a figure shows, in words, read from the figure itself: its alt text on the site and in the
  stored notebook.
* ``frontier``: Tables and plots for lesson 16: ZeRO++'s bytes on each level of the network and its rounding, and
  the distributed Muon step against torch's.
* ``gantt``: A Gantt chart of what each rank did, and when: the picture lessons 04, 05 and 08 read overlap from.
* ``input_pipeline``: Plots and tables for ``notebooks/08_input_pipeline.ipynb`` (data from
  ``dpteach.experiments.input_pipeline``).
* ``link``: The link control every lesson with a network panel shares, and the sentence that says what set the time.
* ``memory``: Plots and tables for lesson 01: the gradient identity, bitwise reproducibility, and the memory one
  replica needs.
* ``mixed_precision``: Plots and tables for lesson 12: what 16-bit forward passes, loss scales and 16-bit gradients
  cost and save.
* ``options``: Every choice a panel offers, run: the check that no option of a lesson is a dead end.
* ``overlap``: Plots and tables for ``notebooks/04_overlap.ipynb`` (data from
  ``dpteach.experiments.overlap_timeline``).
* ``panel``: The one panel every notebook uses: controls + Run button + output, with the result kept in Python.
* ``prediction``: Predict, run, compare: a number the learner types before a panel runs, checked against what the
  run measured.
* ``record``: What a panel's run produced, kept as plain numbers: the data behind its figures, for a report.
* ``rendering``: What every lesson's render helpers share: tables, figures shown once, legends clear of the data,
  axes of message sizes.
* ``scaling``: Plots and tables for lesson 09: measured scaling on this machine, and the simulator's extrapolation.
* ``sending_less``: Tables and plots for lesson 14: what each method sends, how its loss falls per step and per
  second on each link, PowerSGD against torch's hook, and hybrid sharding's two levels.
* ``sharding``: Plots and tables for lesson 11: what each rank holds under ZeRO and FSDP2, when, and what it costs.
* ``start``: Plots and tables for lesson 00 (this machine).
"""
from ..ranks.processes import warm_up
from .panel import ExperimentPanel

__all__ = ["ExperimentPanel"]

warm_up()
