"""The link control every lesson with a network panel shares, and the sentence that says what set the time."""
from __future__ import annotations

import ipywidgets as widgets

from ..network.link import PRESETS
from ..ranks.backend import visible_gpus
from .controls import choice

LINK_CHOICES = [
    ("emulated 1 Gbit/s Ethernet", "1gbe"),
    ("emulated 10 Gbit/s Ethernet", "10gbe"),
    ("emulated PCIe 4.0 x16", "pcie"),
    ("emulated InfiniBand NDR", "ib"),
    ("emulated NVLink 4", "nvlink"),
    ("none: this machine's own transfers", None),
]


GPU_DEFAULT = "ib"  # on a GPU machine the lessons start on the link between GPU nodes (InfiniBand NDR)


def link_control(default: str | None = "1gbe") -> widgets.Dropdown:
    """A dropdown of the emulated links (``dpteach.network.PRESETS``) and 'none'. ``default`` is the lesson's
    choice for CPU ranks; on a machine with GPUs the dropdown starts on InfiniBand instead, the network
    between the nodes of a GPU cluster (a laptop's 1 Gbit/s would make every GPU-sized exchange seconds long)."""
    if default is not None and default not in PRESETS:
        raise ValueError(f"default={default!r} is not allowed: choose one of {', '.join(PRESETS)} or None")
    if visible_gpus():
        default = GPU_DEFAULT
    return choice(LINK_CHOICES, default, "link", style={"description_width": "initial"},
                  layout=widgets.Layout(width="340px"))


def describe_link(link: dict | None, set_by: dict, device: str = "cpu") -> str:
    """One paragraph (Markdown): the link used, and for which runs this machine, not the link, set the time.

    ``set_by`` maps a run's name to ``"link"``, ``"machine"`` or ``None`` (no message sent); ``device`` is
    where the ranks computed (the emulation runs on the host's clock on CPU ranks, on the GPU's on GPU ranks).
    """
    if link is None:
        own = ("NCCL, or gloo through host memory" if device == "cuda"
               else "gloo copying bytes between processes, on the same cores that compute")
        return f"**No emulated link**: every collective took as long as this machine's own transfers ({own})."
    bandwidth = 1 / link["beta_s_per_byte"] / 1e9 if link["beta_s_per_byte"] else float("inf")
    how = ("then the link's time was spent on a CUDA stream of its own, on the GPU's clock, before the result "
           "could be used (`dpteach/network/emulated_gpu.py`)" if device == "cuda" else
           "then waited, without using the CPU, until this link would have delivered it (`dpteach/network/emulated.py`)")
    text = (f"**Emulated link `{link['name']}`** ({link['alpha_s'] * 1e6:g} us per message, {bandwidth:g} GB/s): "
            f"every collective ran for real and {how}.")
    machine = [name for name, by in set_by.items() if by == "machine"]
    if machine:
        text += (f" For {', '.join(f'`{name}`' for name in machine)}, most messages took longer for real than on "
                 f"the link: there **this machine set the time**, not the link (its own copies, or waiting for the "
                 f"slower rank); a link faster than the machine cannot be emulated.")
    return text
