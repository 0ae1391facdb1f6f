"""Holds ``sitecustomize.py``: the folder ``dpteach profile`` puts first on the command's ``PYTHONPATH``.

Its modules, one line each (``scripts/package_faces.py`` writes this list from their docstrings):

* ``sitecustomize``: Python imports ``sitecustomize`` at start-up from the first folder on its path that has one.
"""
