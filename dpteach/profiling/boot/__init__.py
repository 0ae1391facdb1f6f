"""Holds ``sitecustomize.py``: the folder ``dpteach profile`` puts first on the command's ``PYTHONPATH``."""
