"""How the course writes a number of bytes: binary units (KiB, MiB, GiB), in tables, axes and sentences alike.

One formatter for all of them, so that a sentence under a table never says "437 kB" beside the table's
"426.8 KiB" of the same quantity. Binary, because the quantities are memory and buffers, which torch's
own figures count in powers of two (``bucket_cap_mb`` is a number of MiB: ``torch/nn/parallel/distributed.py``
multiplies it by ``_MB_TO_BYTES = 1024 * 1024``). Link rates stay decimal (Gbit/s, GB/s), as vendors state them.
"""
from __future__ import annotations


def human_bytes(n: float) -> str:
    """``4096`` -> ``"4 KiB"``, ``4.4e6`` -> ``"4.2 MiB"``, ``512`` -> ``"512 B"``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}" if n % size == 0 else f"{n / size:.1f} {unit}"
    return f"{int(n)} B"
