"""The exercises' checks, one module per exercise (``exNN_*.py``), each defining ``EXERCISE``.

``common.py`` holds what several exercises share: per-rank test data whose sums are exact in every
dtype, and helpers that turn a wrong return value into a message for people.
"""
