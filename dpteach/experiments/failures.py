"""When ranks fail (lesson 13, first half): what the peers of a failed rank see, and a job that torchrun restarts.

* ``fault_detection`` runs the small job of ``dpteach/ranks/faults.py`` under torchrun once per fault - a
  rank that raises, one killed by SIGKILL, one that hangs before a collective, one that calls the wrong
  collective - and reads what every rank saw and when: the delay from the fault to each peer's error,
  the error itself, and when torchrun ended the job.
* ``restart_run`` trains under ``torchrun --max-restarts 1`` (``dpteach train``) with a rank killed
  mid-run, and the same run without the kill (on ``dpteach.launch``'s ranks): the restart count, the step
  resumed from, the steps done twice, and how far the two runs' final weights are apart.

Both start torchrun as a child process, as a learner would in a terminal: the fault is real, and so
is torchrun's reaction to it. Most of a small job's time is its workers importing torch (the agent is
forked from a process that has imported torch already, ``dpteach/ranks/zygote.py``; the workers it starts
are fresh interpreters, as under any torchrun) and, in a hang, waiting out the timeout (none): so the
jobs run two at a time where memory allows (``jobs_at_once``), and the cores are not left idle.

* ``replica_groups`` (torchft) keeps a job going without a restart: a dead replica group drops out of the
  quorum and a spare takes its place, recovering the state live from a healthy group.
"""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from .. import validate
from ..ranks.faults import FAULT_KINDS
from ..ranks.zygote import popen_python
from ..training.checkpoint import RESUMABLE

# (kind, TORCH_DISTRIBUTED_DEBUG=DETAIL?) rows of the detection table; the mismatch is caught by DETAIL only.
DETECTION_ROWS = (("raise", False), ("kill", False), ("hang", False), ("hang", True), ("mismatch", True))
DETAIL = " + DETAIL"
FAULT_NAMES = tuple(kind + (DETAIL if debug else "") for kind, debug in DETECTION_ROWS)


def fault_row(name: str) -> tuple[str, bool]:
    """``"hang + DETAIL"`` -> ``("hang", True)``: a detection row by the name the lesson's table gives it."""
    return DETECTION_ROWS[FAULT_NAMES.index(validate.choice("faults", name, FAULT_NAMES))]


def _child_env(env: dict | None = None) -> dict:
    """The environment of a child job: this one's, one thread per process, plus ``env``, and never the world of a
    notebook that itself runs under torchrun (nor its debug setting, unless ``env`` asks for one)."""
    child_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCH_DISTRIBUTED_DEBUG"):
        if name not in (env or {}):
            child_env.pop(name, None)
    return child_env


def _torchrun(world_size: int, module_args: list[str], env: dict | None = None, max_restarts: int = 0,
              timeout: float = 120.0) -> dict:
    """``torchrun --standalone --nproc-per-node W --max-restarts N -m ...`` in a child process."""
    command = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}",
               f"--max-restarts={max_restarts}", "--monitor-interval=0.1", "-m", *module_args]
    started = time.time()
    # The agent is forked from a process that has imported torch already (dpteach/ranks/zygote.py); the workers
    # it starts are fresh interpreters, as under any torchrun.
    with tempfile.TemporaryFile("w+") as output:
        agent = popen_python(command, _child_env(env), stdout=output, stderr=subprocess.STDOUT)
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


def jobs_at_once(wanted: int | None, processes_per_job: int) -> int:
    """How many torchrun jobs to run side by side: ``wanted``, or (None) two where memory allows it.

    A job is an agent and its workers, each a Python process that imports torch (``RANK_MIB`` each,
    ``dpteach/ranks/memory.py``). Most of a small job's time is those imports, which keep one core busy
    each, and the waits of a hang, which keep none: two jobs at once fill two cores where one job leaves
    one idle. More than two only queue for the same cores."""
    from ..ranks.memory import MIB, RANK_MIB, free_memory
    if wanted is not None:
        return validate.integer("parallel", wanted, low=1, high=8)
    free = free_memory()["free"]
    if free is not None and free < 2 * processes_per_job * RANK_MIB * MIB + 512 * MIB:  # and the kernel's own
        return 1
    return 2


def fault_detection(rows=DETECTION_ROWS, world_size: int = 2, step: int = 3, timeout_s: float = 3.0,
                    parallel: int | None = None, faults=None) -> dict:
    """Each ``(kind, debug)`` of ``rows`` (or each name of ``faults``, such as ``"hang + DETAIL"``, where
    given: ``fault_row``): a torchrun job of ``world_size`` ranks all-reducing, rank 1 failing
    as ``kind`` says just before ``step``, ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` if ``debug``; the process
    group's timeout is ``timeout_s``. ``parallel`` jobs run at once (None: two where memory allows, see
    ``jobs_at_once``); each job is a world of its own, so they meet only in competing for the cores, which
    lengthens the delays measured as any busy machine does; a hang's delay is the timeout either way.
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
    parallel = jobs_at_once(parallel, world_size + 1)
    from concurrent.futures import ThreadPoolExecutor
    # The hangs first: their timeouts leave the cores to the other jobs' start-ups.
    order = sorted(range(len(rows)), key=lambda i: rows[i][0] != "hang")
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = {i: pool.submit(_detect_once, *rows[i], world_size, step, timeout_s) for i in order}
        return {"world_size": world_size, "parallel": parallel, "rows": [futures[i].result() for i in range(len(rows))]}


def _train_job(directory: Path, name: str, world_size: int, options: list[str], max_restarts: int) -> dict:
    folder = directory / name
    job = _torchrun(world_size, ["dpteach", "train", "--checkpoint", str(folder / "checkpoints"),
                                 "--json", str(folder / "result.json"), "--weights", str(folder / "weights.pt"),
                                 *options], max_restarts=max_restarts, timeout=300)
    if job["exit_code"] != 0:
        raise RuntimeError(f"the {name} run failed (torchrun exited {job['exit_code']}):\n{job['output'][-3000:]}")
    return {**json.loads((folder / "result.json").read_text()), "weights": torch.load(folder / "weights.pt"),
            "seconds": job["ended"] - job["started"]}


def _untouched_run(directory: Path, strategy: str, world_size: int, steps: int, every: int) -> dict:
    """What ``dpteach train`` runs, without torchrun and without a fault: the same ranks' function, checkpoints and
    all, on ``dpteach.launch``'s ranks (forked from a process that has imported torch: no start-up worth timing).
    One thread per rank, as torchrun's workers here (``_child_env``): a thread count is part of the arithmetic."""
    from ..ranks.launcher import launch
    from ..training.resumable import Checkpointing, train_resumable_on_rank
    from ..training.train import TrainConfig
    started = time.time()
    config = TrainConfig(strategy=strategy, model="mlp", steps=steps)  # dpteach train's defaults
    first = launch(train_resumable_on_rank, world_size, args=(config, Checkpointing(str(directory), every=every), None),
                   env={"OMP_NUM_THREADS": "1"}, show_output=False, progress=False, timeout=300)[0]
    return {"losses": first["losses"], "weights": first["params"], "seconds": time.time() - started}


def restart_run(strategy: str = "ddp", world_size: int = 2, steps: int = 12, every: int = 4, fault_step: int = 6,
                max_restarts: int = 1, parallel: int | None = None) -> dict:
    """The same training run twice: under torchrun with rank 1 killed before ``fault_step`` (and
    ``--max-restarts``), and untouched (``_untouched_run``), to compare the final weights. Checkpoints every
    ``every`` steps. ``parallel``: 2 runs the two side by side (None: where memory allows, ``jobs_at_once``);
    their seconds then include waiting for the cores, so they are reported, not compared."""
    validate.choice("strategy", strategy, RESUMABLE)
    validate.integer("world_size", world_size, low=2, high=8)
    validate.integer("steps", steps, low=2, high=200)
    validate.integer("every", every, low=1, high=steps)
    validate.integer("fault_step", fault_step, low=1, high=steps - 1)
    validate.integer("max_restarts", max_restarts, low=1, high=5)
    options = ["--strategy", strategy, "--steps", str(steps), "--every", str(every)]
    parallel = jobs_at_once(parallel, world_size + 1)
    from concurrent.futures import ThreadPoolExecutor
    with tempfile.TemporaryDirectory(prefix="dpteach-restart-") as tmp, ThreadPoolExecutor(parallel) as pool:
        killed = pool.submit(_train_job, Path(tmp), "killed", world_size,
                             options + ["--fault", f"kill@{fault_step}:1"], max_restarts)
        clean = pool.submit(_untouched_run, Path(tmp) / "untouched", strategy, world_size, steps, every)
        killed, clean = killed.result(), clean.result()
    return {"strategy": strategy, "world_size": world_size, "steps": steps, "every": every, "fault_step": fault_step,
            "max_restarts": max_restarts, "restarts": killed["restarts"], "resumed_from": killed["resumed_from"],
            "steps_redone": fault_step - killed["resumed_from"],
            "max_abs_diff": (killed["weights"] - clean["weights"]).abs().max().item(),
            "losses_killed": killed["losses"], "losses_untouched": clean["losses"],
            "seconds_killed": killed["seconds"], "seconds_untouched": clean["seconds"]}


def torchft_missing() -> str | None:
    """Why ``replica_groups`` cannot run here (torchft ships wheels for Linux on x86-64 only), or None."""
    import importlib.util
    if importlib.util.find_spec("torchft") is None:
        return ("replica_groups needs torchft, which is not installed here: `pip install torchft` (it has wheels for "
                "Linux on x86-64, where installing the course installs it too)")
    return None


def _start_lighthouse(heartbeat_timeout_ms: int) -> subprocess.Popen:
    """torchft's Lighthouse in a child process (its log stays there); ``_lighthouse_address`` reads where it listens."""
    code = ("import time\nfrom torchft._torchft import LighthouseServer\n"
            "lighthouse = LighthouseServer(bind='[::]:0', min_replicas=1, join_timeout_ms=100, "
            f"heartbeat_timeout_ms={heartbeat_timeout_ms})\n"
            "print(lighthouse.address(), flush=True)\ntime.sleep(3600)\n")
    # Its log goes nowhere: a pipe nobody reads would fill up and stop the Lighthouse.
    return popen_python(["-c", code], _child_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def _lighthouse_address(child: subprocess.Popen) -> str:
    address = child.stdout.readline().strip()  # "" only when the child ended before it could print one
    if not address:
        raise RuntimeError(f"torchft's Lighthouse did not start (exit status {child.wait()}): run "
                           f"`python -c 'import torchft._torchft'` to see why")
    return address


# Every group's process imports torch, torchft and the group's code first, says so (a file), and waits for its word
# to start (another file): the groups start training together, and the spare takes the dead group's place when
# told, whatever this machine's import times (on a busy machine, more than group 0's whole run).
WARM = ("import sys, time\nfrom pathlib import Path\n"
        "import torch, torch._dynamo, torchft, torchft.checkpointing.pg_transport\n"  # an optimizer's first build imports dynamo
        "import dpteach.ranks.faults, dpteach.replica.data, dpteach.replica.models\n"
        "from dpteach.training import fault_tolerant\n"
        "Path(sys.argv[1]).touch()\ngo = Path(sys.argv[2])\nwhile not go.exists():\n    time.sleep(0.01)\n"
        "sys.exit(fault_tolerant.main([Path(a[1:]).read_text() if a.startswith('@') else a for a in sys.argv[3:]]))\n")


def _wait_until_ready(folder: Path, children: dict, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while not all((folder / f"{name}.ready").exists() for name in children):
        for name, child in children.items():
            if child.poll() is not None:
                raise RuntimeError(f"{name} ended before it was ready:\n" + (folder / f"{name}.log").read_text()[-3000:])
        if time.time() > deadline:
            raise TimeoutError(f"the replica groups were not ready to train within {timeout:g} s")
        time.sleep(0.02)


def replica_groups(steps: int = 24, kill_after: int = 6, replace_after_s: float = 1.5, timeout_s: float = 5.0,
                   heartbeat_timeout_ms: int = 1000) -> dict:
    """Two torchft replica groups of one CPU rank each train together; group 1 is killed with SIGKILL once
    step ``kill_after`` is committed, and ``replace_after_s`` later a spare takes its place and recovers live
    from group 0 (``dpteach/training/fault_tolerant.py``). Every process imports torch before the groups start
    together, and the spare waits with torch imported, as a job's spare nodes do (``WARM``): when it joins is set
    by ``replace_after_s``, not by how long this machine takes to import torch. The
    Lighthouse counts a group alive until it has not heard its heartbeat for ``heartbeat_timeout_ms``
    (torchft's default: 5000, ``src/lighthouse.rs``); a ``replace_after_s`` beyond it leaves group 0 training
    alone for a while. Returns each group's steps (number, participants, committed, time), the kill's time, the
    step at which the replacement first trained with group 0, group 0's steps alone and its longest step, and
    how far the replacement's final weights are from group 0's."""
    missing = torchft_missing()
    if missing:
        raise ModuleNotFoundError(missing)
    validate.integer("steps", steps, low=4, high=200)
    validate.integer("kill_after", kill_after, low=1, high=steps - 2)
    validate.number("replace_after_s", replace_after_s, low=0, high=60, unit="seconds")
    validate.number("timeout_s", timeout_s, above=0, high=60, unit="seconds")
    validate.integer("heartbeat_timeout_ms", heartbeat_timeout_ms, low=100, high=60_000)
    env = _child_env()
    children = []
    with tempfile.TemporaryDirectory(prefix="dpteach-ft-") as tmp:
        folder = Path(tmp)
        address = folder / "lighthouse"  # written once the Lighthouse, started beside the groups, says where it is

        def start(group: int, name: str, go: str, *extra: str) -> subprocess.Popen:
            command = ["-c", WARM, str(folder / f"{name}.ready"), str(folder / go),
                       "--group", str(group), "--lighthouse", f"@{address}", "--steps", str(steps),
                       "--out", str(folder / f"{name}.json"), "--timeout", str(timeout_s), *extra]
            with open(folder / f"{name}.log", "w") as log:
                children.append(popen_python(command, env, stdout=subprocess.DEVNULL, stderr=log))
            return children[-1]
        try:
            lighthouse = _start_lighthouse(heartbeat_timeout_ms)
            children.append(lighthouse)
            survivor = start(0, "group0", "start")
            doomed = start(1, "group1", "start", "--die-after", str(kill_after))
            replacement = start(1, "replacement", "replace")  # the spare
            address.write_text(_lighthouse_address(lighthouse))
            _wait_until_ready(folder, {"group0": survivor, "group1": doomed, "replacement": replacement})
            (folder / "start").touch()
            doomed.wait(timeout=120)
            time.sleep(replace_after_s)
            (folder / "replace").touch()
            told = time.time()  # the spare is told to take over: what the figure's dashed line marks
            for child, name in ((survivor, "group0"), (replacement, "replacement")):
                if child.wait(timeout=180) != 0:
                    raise RuntimeError(f"{name} failed:\n" + (folder / f"{name}.log").read_text()[-3000:])
        finally:
            for child in children:  # nothing left behind, whatever happened
                if child.poll() is None:
                    child.kill()
        runs = {name: json.loads((folder / f"{name}.json").read_text()) for name in ("group0", "group1", "replacement")}
        weights = {name: torch.load(folder / f"{name}.pt") for name in ("group0", "replacement")}
    killed_at = runs["group1"]["killed_at"]
    survivor_log = runs["group0"]["log"]
    alone = [r for r in survivor_log if r["at"] > killed_at and r["participants"] == 1]
    gaps = [b["at"] - a["at"] for a, b in zip(survivor_log, survivor_log[1:])]
    joined = next((r["step"] for r in runs["replacement"]["log"] if r["participants"] > 1), None)
    return {"steps": steps, "kill_after": kill_after, "replace_after_s": replace_after_s, "timeout_s": timeout_s,
            "heartbeat_timeout_s": heartbeat_timeout_ms / 1e3,
            "logs": {name: run["log"] for name, run in runs.items()}, "killed_at": killed_at,
            "replacement_told": told, "replacement_started": runs["replacement"]["started"],
            "replacement_joined_at_step": joined, "group0_steps_alone": len(alone),
            "group0_longest_step_s": max(gaps), "group0_median_step_s": statistics.median(gaps),
            "group0_uncommitted": sum(not r["committed"] for r in survivor_log),
            "max_abs_diff": (weights["group0"] - weights["replacement"]).abs().max().item()}
