"""Tables and plots for lesson 16: ZeRO++'s bytes on each level of the network and its rounding, and the
distributed Muon step against torch's. DeMo and streaming DiLoCo use lesson 14's (``sending_less.py``)."""
from __future__ import annotations

from .rendering import human_bytes, show, table
from .sending_less import plot_levels


def _size(n) -> str:
    return "-" if n is None else human_bytes(n)


def _rounding(row: dict) -> str:
    noted = row["quantisation"]
    if not noted:
        return "none"
    return "; ".join(f"{part}: {v['max_error']:.1e} ({v['of_bound']:.2f} of its bound)" for part, v in noted.items())


def render_zeropp(result: dict) -> None:
    """Per variant: bytes per rank and step across nodes and inside them, counted and received on the sockets,
    the share of zero3's across, the largest rounding each quantising part made, and the distance from zero3."""
    table(["variant", "across nodes", "received across", "x zero3 across", "inside nodes", "received inside",
           "largest rounding", "max |dθ| vs zero3", "final loss"],
          [[r["variant"], _size(r["bytes_between_per_step"]), _size(r["received_between_per_step"]),
            f"{r['between_vs_zero3']:.3f}", _size(r["bytes_inside_per_step"]), _size(r["received_inside_per_step"]),
            _rounding(r), f"{r['max_abs_diff_vs_zero3']:.1e}", f"{r['final_loss']:.4f}"] for r in result["rows"]],
          title=f"{result['world_size']} ranks as {result['nodes']} nodes of {result['ranks_per_node']}, link "
                f"{result['link']['name']}, {result['steps']} steps; bytes per rank and step")
    print("'received' is what the kernel counted on the gloo sockets (zero3 keeps no sockets of its own: '-').")
    show(plot_zeropp(result))


def plot_zeropp(result: dict):
    rows = result["rows"]
    return plot_levels(rows, [r["variant"] for r in rows], "MiB each rank sends per step (counted)",
                       f"ZeRO++'s parts on {result['link']['name']}")


def render_muon(result: dict) -> None:
    """Per rank: the parameters it owns, its block and padding, the momentum it keeps, what it sent, and how far
    its weights ended from torch's Muon in one process."""
    table(["rank", "owns parameters", "block (elements)", "padding (all ranks)", "momentum kept", "sent",
           "max |dθ| vs torch's Muon"],
          [[r["rank"], ", ".join(map(str, r["owned"])), f"{r['block_elements']:,}", f"{r['padding_elements']:,}",
            f"{r['momentum_elements']:,}", human_bytes(r["bytes"]), f"{r['max_abs_diff']:.1e}"]
           for r in result["ranks"]],
          title=f"One distributed Muon step on {result['world_size']} ranks (tolerance {result['tolerance']:.0e})")
