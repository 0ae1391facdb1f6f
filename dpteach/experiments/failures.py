"""When ranks fail (lesson 13, first half): what the peers of a failed rank see, and a job that torchrun restarts.

* ``fault_detection`` runs the small job of ``dpteach/ranks/faults.py`` under torchrun once per fault - a
  rank that raises, one killed by SIGKILL, one that hangs before a collective, one that calls the wrong
  collective - and reads what every rank saw and when: the delay from the fault to each peer's error,
  the error itself, and when torchrun ended the job.
* ``restart_run`` trains under ``torchrun --max-restarts 1`` (``dpteach train``) with a rank killed
  mid-run, and the same run without the kill: the restart count, the step resumed from, the steps done
  twice, and how far the two runs' final weights are apart.

Both start torchrun as a child process, as a learner would in a terminal: the fault is real, and so
is torchrun's reaction to it.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from .. import validate
from ..ranks.faults import FAULT_KINDS
from ..training.checkpoint import RESUMABLE

# (kind, TORCH_DISTRIBUTED_DEBUG=DETAIL?) rows of the detection table; the mismatch is caught by DETAIL only.
DETECTION_ROWS = (("raise", False), ("kill", False), ("hang", False), ("hang", True), ("mismatch", True))


def _torchrun(world_size: int, module_args: list[str], env: dict | None = None, max_restarts: int = 0,
              timeout: float = 120.0) -> dict:
    """``torchrun --standalone --nproc-per-node W --max-restarts N -m ...`` in a child process."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}",
               f"--max-restarts={max_restarts}", "--monitor-interval=0.1", "-m", *module_args]
    child_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCH_DISTRIBUTED_DEBUG"):
        if name not in (env or {}):
            child_env.pop(name, None)  # a notebook under torchrun must not hand its own world to the child job
    started = time.time()
    try:
        done = subprocess.run(command, env=child_env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise TimeoutError(f"torchrun did not end within {timeout:g} s: {' '.join(command)}") from exc
    return {"exit_code": done.returncode, "output": done.stdout + done.stderr, "started": started,
            "ended": time.time()}


def _clean(message: str | None) -> str | None:
    """A gloo error without its build path and emoji: ``[/path/pair.cc:537] Read error`` -> ``Read error``."""
    if message is None:
        return None
    message = re.sub(r"\[/[^\]]*\]\s*", "", message)
    return message.encode("ascii", "ignore").decode().replace(" GLHF!", "").strip()


def _agent_lines(output: str) -> list[str]:
    """What torchrun itself said about the failure (its own log lines and its summary), without the ranks'."""
    keep = []
    for line in output.splitlines():
        line = line.replace(sys.executable, "python")
        if re.search(r"elastic/multiprocessing/api\.py:\d+\]", line):  # its log: which worker failed, whom it stopped
            keep.append(line.split("] ", 1)[1].strip())
        elif line.strip().startswith(("exitcode  :", "rank      :", "traceback :")):
            keep.append(" ".join(line.split()))
    return keep[:8]


def _detect_once(kind: str, debug: bool, world_size: int, step: int, timeout_s: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="dpteach-fault-") as out:
        env = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"} if debug else {}
        job = _torchrun(world_size, ["dpteach.ranks.faults", "--kind", kind, "--step", str(step), "--rank", "1",
                                     "--steps", str(step + 4), "--timeout", str(timeout_s), "--out", out],
                        env=env, timeout=timeout_s + 90)
        records = {p.name: json.loads(p.read_text()) for p in Path(out).glob("*.json")}
    fault = records.get("fault-rank1.json")
    if fault is None:
        raise RuntimeError(f"the {kind} fault never struck (torchrun exited {job['exit_code']}):\n{job['output'][-2000:]}")
    ranks = []
    for rank in range(world_size):
        seen = records.get(f"seen-rank{rank}.json")
        ranks.append({"rank": rank, "faulty": rank == 1, "saw_error": seen is not None and seen["error"] is not None,
                      "after_s": None if seen is None else seen["at"] - fault["at"],
                      "error": None if seen is None else _clean(seen["error"])})
    peers = [r for r in ranks if not r["faulty"]]
    return {"kind": kind, "debug_detail": debug, "fault_step": step, "timeout_s": timeout_s,
            "ranks": ranks, "peers_knew_after_s": max((r["after_s"] for r in peers if r["saw_error"]), default=None),
            "every_peer_knew": all(r["saw_error"] for r in peers),
            "job_ended_after_s": job["ended"] - fault["at"], "torchrun_exit_code": job["exit_code"],
            "torchrun_said": _agent_lines(job["output"])}


def fault_detection(rows=DETECTION_ROWS, world_size: int = 2, step: int = 3, timeout_s: float = 3.0) -> dict:
    """Each ``(kind, debug)`` of ``rows``: a torchrun job of ``world_size`` ranks all-reducing, rank 1 failing
    as ``kind`` says just before ``step``, ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` if ``debug``; the process
    group's timeout is ``timeout_s``. Returns ``{"rows": [...]}``, one row per job (see ``_detect_once``)."""
    rows = [tuple(r) for r in rows]
    for kind, debug in rows:
        validate.choice("kind", kind, FAULT_KINDS)
        if kind == "mismatch" and not debug:
            raise ValueError("rows=('mismatch', False) is not allowed: without TORCH_DISTRIBUTED_DEBUG=DETAIL a "
                             "mismatched gloo collective may crash or hang at random; run it with debug=True")
    validate.integer("world_size", world_size, low=2, high=8)
    validate.integer("step", step, low=1, high=50)
    validate.number("timeout_s", timeout_s, above=0, high=60, unit="seconds")
    return {"world_size": world_size, "rows": [_detect_once(kind, debug, world_size, step, timeout_s)
                                               for kind, debug in rows]}


def _train_job(directory: Path, name: str, world_size: int, options: list[str], max_restarts: int) -> dict:
    folder = directory / name
    job = _torchrun(world_size, ["dpteach", "train", "--checkpoint", str(folder / "checkpoints"),
                                 "--json", str(folder / "result.json"), "--weights", str(folder / "weights.pt"),
                                 *options], max_restarts=max_restarts, timeout=300)
    if job["exit_code"] != 0:
        raise RuntimeError(f"the {name} run failed (torchrun exited {job['exit_code']}):\n{job['output'][-3000:]}")
    return {**json.loads((folder / "result.json").read_text()), "weights": torch.load(folder / "weights.pt"),
            "seconds": job["ended"] - job["started"], "torchrun_said": _agent_lines(job["output"])}


def restart_run(strategy: str = "ddp", world_size: int = 2, steps: int = 12, every: int = 4, fault_step: int = 6,
                max_restarts: int = 1) -> dict:
    """The same training run twice under torchrun: once with rank 1 killed before ``fault_step`` (and
    ``--max-restarts``), once untouched. Checkpoints every ``every`` steps."""
    validate.choice("strategy", strategy, RESUMABLE)
    validate.integer("world_size", world_size, low=2, high=8)
    validate.integer("steps", steps, low=2, high=200)
    validate.integer("every", every, low=1, high=steps)
    validate.integer("fault_step", fault_step, low=1, high=steps - 1)
    validate.integer("max_restarts", max_restarts, low=1, high=5)
    options = ["--strategy", strategy, "--steps", str(steps), "--every", str(every)]
    with tempfile.TemporaryDirectory(prefix="dpteach-restart-") as tmp:
        killed = _train_job(Path(tmp), "killed", world_size, options + ["--fault", f"kill@{fault_step}:1"],
                            max_restarts)
        clean = _train_job(Path(tmp), "untouched", world_size, options, 0)
    return {"strategy": strategy, "world_size": world_size, "steps": steps, "every": every, "fault_step": fault_step,
            "max_restarts": max_restarts, "restarts": killed["restarts"], "resumed_from": killed["resumed_from"],
            "steps_redone": fault_step - killed["resumed_from"],
            "max_abs_diff": (killed["weights"] - clean["weights"]).abs().max().item(),
            "losses_killed": killed["losses"], "losses_untouched": clean["losses"],
            "seconds_killed": killed["seconds"], "seconds_untouched": clean["seconds"],
            "checkpoint_seconds": clean["checkpoint_seconds"], "checkpoint_bytes": clean["checkpoint_bytes"],
            "torchrun_said": killed["torchrun_said"]}
