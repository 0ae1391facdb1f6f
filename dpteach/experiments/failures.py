"""When ranks fail (lesson 13, first half): what the peers of a failed rank see, and a job that torchrun restarts.

* ``fault_detection`` runs the small job of ``dpteach/ranks/faults.py`` under torchrun once per fault - a
  rank that raises, one killed by SIGKILL, one that hangs before a collective, one that calls the wrong
  collective - and reads what every rank saw and when: the delay from the fault to each peer's error,
  the error itself, and when torchrun ended the job.
* ``restart_run`` trains under ``torchrun --max-restarts 1`` (``dpteach train``) with a rank killed
  mid-run, and the same run without the kill (on ``dpteach.launch``'s ranks): the restart count, the step
  resumed from, the steps done twice, and how far the two runs' final weights are apart.

Both start torchrun as a child process, as a learner would in a terminal: the fault is real, and so
is torchrun's reaction to it. The agent and, unless ``fresh_workers=True``, its workers are forked from a
process that has imported torch already (``dpteach/ranks/zygote.py``, ``ranks/zygote_guest.py``), so that a job
does not spend its time importing torch: a fresh worker's import is seconds of CPU on a laptop, a fork is
milliseconds. What is left is mostly waiting (a hang waits out the timeout), so the jobs run side by side
where memory allows (``jobs_at_once``).

``torchft_groups.replica_groups`` (torchft) keeps a job going without a restart: a dead replica group drops
out of the quorum and a spare takes its place, recovering the state live from a healthy group.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from .. import validate
from ..ranks.faults import FAULT_KINDS
from ..ranks.processes import ONE_THREAD, child_job_env
from ..ranks.zygote import popen_python, use_zygote
from ..training.checkpoint import RESUMABLE

# (kind, TORCH_DISTRIBUTED_DEBUG=DETAIL?) rows of the detection table; the mismatch is caught by DETAIL only.
DETECTION_ROWS = (("raise", False), ("kill", False), ("hang", False), ("hang", True), ("mismatch", True))
DETAIL = " + DETAIL"
FAULT_NAMES = tuple(kind + (DETAIL if debug else "") for kind, debug in DETECTION_ROWS)


def fault_row(name: str) -> tuple[str, bool]:
    """``"hang + DETAIL"`` -> ``("hang", True)``: a detection row by the name the lesson's table gives it."""
    return DETECTION_ROWS[FAULT_NAMES.index(validate.choice("faults", name, FAULT_NAMES))]


def _fresh_workers(asked) -> bool:
    """Whether torchrun's workers will be fresh interpreters: asked for, or no zygote to fork them from (macOS,
    ``DPTEACH_FRESH_RANKS=1``)."""
    return bool(validate.choice("fresh_workers", asked, (False, True))) or not use_zygote()


def _torchrun(world_size: int, module_args: list[str], env: dict | None = None, max_restarts: int = 0,
              timeout: float = 120.0, fresh_workers: bool = False) -> dict:
    """``torchrun --standalone --nproc-per-node W --max-restarts N -m ...`` in a child process.

    The agent is forked from a process that has imported torch already (``dpteach/ranks/zygote.py``). Its
    workers are too, unless ``fresh_workers``: torchrun is told ``--no-python python -m
    dpteach.ranks.zygote_guest -m ...``, and each worker it starts asks the same zygote for a fork of itself
    (``ranks/zygote_guest.py``). torchrun's part - starting, watching, stopping and restarting the workers - is the
    same either way; only the workers' imports are skipped."""
    from ..ranks.zygote_guest import forked_python
    worker = ["-m"] if fresh_workers else ["--no-python", *forked_python(), "-m"]
    command = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}",
               f"--max-restarts={max_restarts}", "--monitor-interval=0.1", *worker, *module_args]
    started = time.time()
    with tempfile.TemporaryFile("w+") as output:
        agent = popen_python(command, child_job_env(env), stdout=output, stderr=subprocess.STDOUT)
        try:
            code = agent.wait(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            agent.kill()
            raise TimeoutError(f"torchrun did not end within {timeout:g} s: torchrun {' '.join(command[2:])}") from exc
        output.seek(0)
        return {"exit_code": code, "output": output.read(), "started": started, "ended": time.time()}


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


def _detect_once(kind: str, debug: bool, world_size: int, step: int, timeout_s: float, fresh_workers: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="dpteach-fault-") as out:
        env = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"} if debug else {}
        job = _torchrun(world_size, ["dpteach.ranks.faults", "--kind", kind, "--step", str(step), "--rank", "1",
                                     "--steps", str(step + 4), "--timeout", str(timeout_s), "--out", out],
                        env=env, timeout=timeout_s + 90, fresh_workers=fresh_workers)
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


def jobs_at_once(wanted: int | None, processes_per_job: int, jobs: int, fresh_workers: bool) -> int:
    """How many of ``jobs`` torchrun jobs to run side by side: ``wanted``, or (None) as many as memory allows.

    A job is an agent and its workers, ``RANK_MIB`` of memory each at most (``dpteach/ranks/memory.py``).
    Fresh workers spend most of a small job importing torch, which keeps a core busy each: two jobs fill two
    cores, more only queue for them. Forked workers skip the import, and what is left of a job is mostly
    waiting (a hang waits out its timeout on no core at all): every job at once."""
    from ..ranks.memory import MIB, RANK_MIB, free_memory
    if wanted is not None:
        return validate.integer("parallel", wanted, low=1, high=8)
    most = min(jobs, 2 if fresh_workers else jobs)
    free = free_memory()["free"]
    if free is not None:  # and 512 MiB for the kernel's own
        most = min(most, max(1, (free - 512 * MIB) // (processes_per_job * RANK_MIB * MIB)))
    return max(1, int(most))


def fault_detection(rows=DETECTION_ROWS, world_size: int = 2, step: int = 3, timeout_s: float = 3.0,
                    parallel: int | None = None, faults=None, fresh_workers: bool = False) -> dict:
    """Each ``(kind, debug)`` of ``rows`` (or each name of ``faults``, such as ``"hang + DETAIL"``, where
    given: ``fault_row``): a torchrun job of ``world_size`` ranks all-reducing, rank 1 failing
    as ``kind`` says just before ``step``, ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` if ``debug``; the process
    group's timeout is ``timeout_s``. ``parallel`` jobs run at once (None: see ``jobs_at_once``); each job is
    a world of its own, so they meet only in competing for the cores, which lengthens the delays measured as
    any busy machine does; a hang's delay is the timeout either way. ``fresh_workers``: torchrun's workers
    are fresh interpreters that import torch, instead of forks (``_torchrun``).
    Returns ``{"world_size", "parallel", "rows": [...]}``, one row per job in the order of ``rows``
    (see ``_detect_once``)."""
    if faults is not None:
        rows = [fault_row(name) for name in validate.choices("faults", faults, FAULT_NAMES)]
    rows = [tuple(r) for r in rows]
    for kind, debug in rows:
        validate.choice("kind", kind, FAULT_KINDS)
        if kind == "mismatch" and not debug:
            raise ValueError("rows=('mismatch', False) is not allowed: without TORCH_DISTRIBUTED_DEBUG=DETAIL a "
                             "mismatched gloo collective may crash or hang at random; run it with debug=True")
    validate.integer("world_size", world_size, low=2, high=8)
    validate.integer("step", step, low=1, high=50)
    validate.number("timeout_s", timeout_s, above=0, high=60, unit="seconds")
    fresh_workers = _fresh_workers(fresh_workers)
    parallel = jobs_at_once(parallel, world_size + 1, len(rows), fresh_workers)
    from concurrent.futures import ThreadPoolExecutor
    # The hangs first: their timeouts leave the cores to the other jobs' start-ups.
    order = sorted(range(len(rows)), key=lambda i: rows[i][0] != "hang")
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = {i: pool.submit(_detect_once, *rows[i], world_size, step, timeout_s, fresh_workers) for i in order}
        return {"world_size": world_size, "parallel": parallel, "rows": [futures[i].result() for i in range(len(rows))]}


def _train_job(directory: Path, name: str, world_size: int, options: list[str], max_restarts: int,
               fresh_workers: bool) -> dict:
    folder = directory / name
    job = _torchrun(world_size, ["dpteach", "train", "--checkpoint", str(folder / "checkpoints"),
                                 "--json", str(folder / "result.json"), "--weights", str(folder / "weights.pt"),
                                 *options], max_restarts=max_restarts, timeout=300, fresh_workers=fresh_workers)
    if job["exit_code"] != 0:
        raise RuntimeError(f"the {name} run failed (torchrun exited {job['exit_code']}):\n{job['output'][-3000:]}")
    return {**json.loads((folder / "result.json").read_text()), "weights": torch.load(folder / "weights.pt"),
            "seconds": job["ended"] - job["started"]}


def _untouched_run(directory: Path, strategy: str, world_size: int, steps: int, every: int) -> dict:
    """What ``dpteach train`` runs, without torchrun and without a fault: the same ranks' function, checkpoints and
    all, on ``dpteach.launch``'s ranks (forked from a process that has imported torch: no start-up worth timing).
    One thread per rank, as torchrun's workers here (``child_job_env``): a thread count is part of the arithmetic."""
    from ..ranks.launcher import launch
    from ..training.resumable import Checkpointing, train_resumable_on_rank
    from ..training.train import TrainConfig
    started = time.time()
    config = TrainConfig(strategy=strategy, model="mlp", steps=steps)  # dpteach train's defaults
    first = launch(train_resumable_on_rank, world_size, args=(config, Checkpointing(str(directory), every=every), None),
                   env=ONE_THREAD, show_output=False, progress=False, timeout=300)[0]
    return {"losses": first["losses"], "weights": first["params"], "seconds": time.time() - started}


def restart_run(strategy: str = "ddp", world_size: int = 2, steps: int = 12, every: int = 4, fault_step: int = 6,
                max_restarts: int = 1, parallel: int | None = None, fresh_workers: bool = False) -> dict:
    """The same training run twice: under torchrun with rank 1 killed before ``fault_step`` (and
    ``--max-restarts``), and untouched (``_untouched_run``), to compare the final weights. Checkpoints every
    ``every`` steps. ``parallel``: 2 runs the two side by side (None: where memory allows, ``jobs_at_once``);
    their seconds then include waiting for the cores, so they are reported, not compared. ``fresh_workers``:
    torchrun's workers are fresh interpreters, each importing torch, as a real restart's are (``_torchrun``)."""
    validate.choice("strategy", strategy, RESUMABLE)
    validate.integer("world_size", world_size, low=2, high=8)
    validate.integer("steps", steps, low=2, high=200)
    validate.integer("every", every, low=1, high=steps)
    validate.integer("fault_step", fault_step, low=1, high=steps - 1)
    validate.integer("max_restarts", max_restarts, low=1, high=5)
    fresh_workers = _fresh_workers(fresh_workers)
    options = ["--strategy", strategy, "--steps", str(steps), "--every", str(every)]
    parallel = jobs_at_once(parallel, world_size + 1, 2, fresh_workers)
    from concurrent.futures import ThreadPoolExecutor
    with tempfile.TemporaryDirectory(prefix="dpteach-restart-") as tmp, ThreadPoolExecutor(parallel) as pool:
        killed = pool.submit(_train_job, Path(tmp), "killed", world_size,
                             options + ["--fault", f"kill@{fault_step}:1"], max_restarts, fresh_workers)
        clean = pool.submit(_untouched_run, Path(tmp) / "untouched", strategy, world_size, steps, every)
        killed, clean = killed.result(), clean.result()
    return {"strategy": strategy, "world_size": world_size, "steps": steps, "every": every, "fault_step": fault_step,
            "max_restarts": max_restarts, "fresh_workers": fresh_workers, "restarts": killed["restarts"],
            "resumed_from": killed["resumed_from"],
            "steps_redone": fault_step - killed["resumed_from"],
            "max_abs_diff": (killed["weights"] - clean["weights"]).abs().max().item(),
            "losses_killed": killed["losses"], "losses_untouched": clean["losses"],
            "seconds_killed": killed["seconds"], "seconds_untouched": clean["seconds"]}
