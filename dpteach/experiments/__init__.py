"""One function per lesson: each runs real ranks and returns plain data (dicts and lists).

Notebooks, widgets, the command line and the tests all call these, so a number printed in a
notebook and a number asserted in a test come from the same code.
"""
from .compare import compare_strategies, run_strategy

__all__ = ["compare_strategies", "run_strategy"]
