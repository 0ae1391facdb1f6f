"""Lesson 17: profile a DDP job with a planted problem, and let the trace name it.

``planted_job`` runs the course's planted script (``dpteach.profiling.planted``) under torchrun exactly as a
learner's own job would run - ``dpteach profile`` around an unedited command, fresh worker processes, gloo on
CPU or NCCL on GPUs - then reads the traces with ``dpteach diagnose``. Nothing here knows which problem was
planted except the argument it passes on: the diagnosis has only the traces.
"""
from __future__ import annotations

import os
import tempfile
import time

from .. import validate
from ..profiling import profile_command, torchrun
from ..profiling.diagnose import diagnose
from ..profiling.merge import merge_traces
from ..profiling.planted import PLANTS
from ..ranks.rank_output import progress_bar

EXPECTED = {"healthy": None, "tiny-buckets": ("tiny_buckets", "03"), "no-overlap": ("no_overlap", "04"),
            "slow-loader": ("slow_loader_on_one_rank", "08"), "slow-rank": ("straggler", "07"),
            "unused-layers": ("find_unused_parameters", "03")}


def planted_job(plant: str = "slow-loader", world_size: int = 2, steps: int = 5, skip: int = 3,
                slow_ms: float = 40.0, out: str | None = None, trace: str | None = None,
                timeout: float = 300.0) -> dict:
    """Profile the planted script on ``world_size`` ranks (``steps`` recorded after ``skip``) and diagnose it.

    ``out``: the folder for the per-rank traces (default: a new temporary one; with ``trace``, a folder beside it);
    ``trace``: where to write the merged trace of all ranks (default ``out/merged.json``). Returns ``{"plant",
    "world_size", "folder", "trace", "diagnosis", "profile_s", "expected"}``; ``expected`` is the finding (kind,
    lesson) the plant should produce, for checking the diagnosis, never for making it."""
    validate.choice("plant", plant, PLANTS)
    validate.integer("world_size", world_size, low=2, high=16, why=" (a diagnosis compares ranks)")
    validate.integer("steps", steps, low=3, high=50)
    validate.integer("skip", skip, low=0, high=50)
    validate.number("slow_ms", slow_ms, low=0, high=1000, unit="milliseconds")
    if out is None:
        out = (os.path.splitext(trace)[0] + "-ranks" if trace
               else os.path.join(tempfile.mkdtemp(prefix="dpteach-traces-"), plant))
    folder = out
    # The job runs in processes of its own, silent: the bar says which of the three stages the run is in (the first
    # one, torchrun starting the ranks and the ranks training, takes most of the time)
    bar = progress_bar(total=3, desc=f"profiling {world_size} ranks")
    try:
        started = time.perf_counter()
        profile_command(torchrun(["-m", "dpteach.profiling.planted", "--plant", plant, "--steps",
                                  str(skip + steps + 2), "--slow-ms", str(slow_ms)], world_size),
                        out=folder, steps=steps, skip=skip, timeout=timeout, quiet=True)
        profile_s = time.perf_counter() - started
        bar.set_description("diagnosing the traces")
        bar.update(1)
        result = diagnose(folder)
        bar.set_description("merging the ranks' traces")
        bar.update(1)
        merged = merge_traces(folder, trace)
        bar.update(1)
    finally:
        bar.close()
    return {"plant": plant, "world_size": world_size, "folder": folder, "trace": merged,
            "diagnosis": result, "profile_s": round(profile_s, 2), "expected": EXPECTED[plant]}
