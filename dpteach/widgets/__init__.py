"""ipywidgets panels for the notebooks: controls, a Run button, and an output area.

Panels hold no training logic: the Run button calls a function of ``dpteach.experiments`` with the
controls' values and hands the plain-data result to a render function (plots, small tables).

A notebook that imports the panels is about to launch ranks: the zygote they are forked from
(``dpteach/ranks/zygote.py``) starts importing torch now, beside the notebook's own imports, rather than
at the first Run.
"""
from ..ranks.processes import warm_up
from .panel import ExperimentPanel

__all__ = ["ExperimentPanel"]

warm_up()
