"""ipywidgets panels for the notebooks: controls, a Run button, and an output area.

Panels hold no training logic: the Run button calls a function of ``dpteach.experiments`` with the
controls' values and hands the plain-data result to a render function (plots, small tables).
"""
from .panel import ExperimentPanel

__all__ = ["ExperimentPanel"]
