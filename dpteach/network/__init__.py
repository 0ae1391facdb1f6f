"""The network and its cost: what a link is, what a collective costs on it, and how one is sent.

``link`` is the value (alpha, beta, gamma; the published presets); ``costmodel`` prices the all-reduce
algorithms on a link and fits a link to measurements; ``scaling`` extrapolates a training step to thousands
of ranks; ``emulated`` and ``emulated_gpu`` hold real collectives to a chosen link; ``comm`` is the one door
every strategy's collectives go through - counted, drawn on the timeline, on a link when there is one.

Its modules, one line each (``scripts/package_faces.py`` writes this list from their docstrings):

* ``comm``: ``Comm``: the collectives a strategy sends through - torch's, the course's own, or on an emulated link.
* ``costmodel``: Predict how long an all-reduce takes, with the alpha-beta(-gamma) cost model.
* ``emulated``: An emulated link: every collective runs for real, but finishes no earlier than a chosen network
  allows.
* ``emulated_gpu``: The emulated link on a GPU: each collective's link time is spent on a CUDA stream, on the GPU's
  clock.
* ``link``: A network link as the alpha-beta(-gamma) model sees it, and the published links the course uses.
* ``scaling``: A scaling simulator: how efficient would data-parallel training be on W = 1 ...
* ``traffic``: What really reaches a process: the kernel's count of the bytes received on the sockets gloo opened
  for one process group.
* ``two_level``: A network of two levels: a fast link between the ranks of one node, a slow one between nodes.
"""
from .link import PRESETS, Link, resolve_link

__all__ = ["PRESETS", "Link", "resolve_link"]
