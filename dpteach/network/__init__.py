"""The network and its cost: what a link is, what a collective costs on it, and how one is sent.

``link`` is the value (alpha, beta, gamma; the published presets); ``costmodel`` prices the all-reduce
algorithms on a link and fits a link to measurements; ``scaling`` extrapolates a training step to thousands
of ranks; ``emulated`` and ``emulated_gpu`` hold real collectives to a chosen link; ``comm`` is the one door
every strategy's collectives go through - counted, drawn on the timeline, on a link when there is one.
"""
from .link import PRESETS, Link, resolve_link

__all__ = ["PRESETS", "Link", "resolve_link"]
