"""The link control every lesson with a network panel shares, and the sentence that says what set the time."""
from __future__ import annotations

import ipywidgets as widgets

from ..link import PRESETS

LINK_CHOICES = [
    ("emulated 1 Gbit/s Ethernet", "1gbe"),
    ("emulated 10 Gbit/s Ethernet", "10gbe"),
    ("emulated PCIe 4.0 x16", "pcie"),
    ("emulated InfiniBand NDR", "ib"),
    ("emulated NVLink 4", "nvlink"),
    ("none: this machine's own transfers", None),
]


def link_control(default: str | None = "1gbe") -> widgets.Dropdown:
    """A dropdown of the emulated links (``dpteach.link.PRESETS``) and 'none'."""
    if default is not None and default not in PRESETS:
        raise ValueError(f"default={default!r} is not allowed: choose one of {', '.join(PRESETS)} or None")
    return widgets.Dropdown(options=LINK_CHOICES, value=default, description="link",
                            style={"description_width": "initial"}, layout=widgets.Layout(width="340px"))


def describe_link(link: dict | None, set_by: dict) -> str:
    """One paragraph (Markdown): the link used, and for which runs this machine, not the link, set the time.

    ``set_by`` maps a run's name to ``"link"``, ``"machine"`` or ``None`` (no message sent).
    """
    if link is None:
        return ("**No emulated link**: every collective took as long as this machine's own transfers (gloo copying "
                "bytes between processes, on the same cores that compute).")
    bandwidth = 1 / link["beta_s_per_byte"] / 1e9 if link["beta_s_per_byte"] else float("inf")
    text = (f"**Emulated link `{link['name']}`** ({link['alpha_s'] * 1e6:g} us per message, {bandwidth:g} GB/s): "
            f"every collective ran for real and then waited, without using the CPU, until this link would have "
            f"delivered it (`dpteach/link.py`).")
    machine = [name for name, by in set_by.items() if by == "machine"]
    if machine:
        text += (f" For {', '.join(f'`{name}`' for name in machine)}, most messages took longer for real than on "
                 f"the link: there **this machine set the time**, not the link (its own copies, or waiting for the "
                 f"slower rank); a link faster than the machine cannot be emulated.")
    return text
