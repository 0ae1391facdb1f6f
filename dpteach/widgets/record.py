"""What a panel's run produced, kept as plain numbers: the data behind its figures, for a report.

``scripts/gpu_lessons.py`` runs every lesson on a GPU machine and reports, per lesson, the model that
ran and the numbers behind each figure. It sets ``DPTEACH_RECORD_DIR``; then every finished run of an
:class:`~dpteach.widgets.panel.ExperimentPanel` writes one JSON file there (written whole, then renamed
into place, so a reader never sees half a file). Nothing is written when the variable is unset.

The record keeps what is plain data - numbers, strings, booleans - and leaves out what is bulky or
not data: per-rank spans, raw runs, weight tensors; long lists are cut to their first and last items.
"""
from __future__ import annotations

import json
import math
import os
import re
import time

RECORD_DIR = "DPTEACH_RECORD_DIR"
BULKY = {"runs", "spans", "timelines", "params", "per_rank", "trace", "steps_trace"}
LONGEST = 40  # items of a list kept whole; longer ones keep their first and last 20


def plain(value, depth: int = 0):
    """``value`` reduced to JSON-able plain data (None for what is not data)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if depth > 6:
        return None
    if isinstance(value, dict):
        return {str(k): plain(v, depth + 1) for k, v in value.items()
                if str(k) not in BULKY or isinstance(v, (int, float, str))}  # "params" is a count in a model choice
    if isinstance(value, (list, tuple)):
        items = list(value)
        if len(items) > LONGEST:
            items = items[:LONGEST // 2] + ["..."] + items[-LONGEST // 2:]
        return [plain(v, depth + 1) for v in items]
    if hasattr(value, "item") and getattr(value, "numel", lambda: 2)() == 1:  # a one-element tensor
        return plain(value.item(), depth)
    return None


def record_run(title: str, values: dict, result, error: BaseException | None, seconds: float) -> str | None:
    """Write one run's record into ``$DPTEACH_RECORD_DIR`` (if set); return the file's path."""
    folder = os.environ.get(RECORD_DIR)
    if not folder:
        return None
    os.makedirs(folder, exist_ok=True)
    stamp = f"{time.time_ns()}"
    slug = re.sub(r"[^a-z0-9]+", "_", title.lower()).strip("_")[:40] or "panel"
    path = os.path.join(folder, f"{stamp}_{slug}.json")
    record = {"title": title, "seconds": seconds, "values": plain(values),
              "error": None if error is None else f"{type(error).__name__}: {error}", "result": plain(result)}
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)
    return path
