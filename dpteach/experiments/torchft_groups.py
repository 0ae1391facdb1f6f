"""Surviving a failure without a restart (lesson 13, last section): torchft's replica groups.

``replica_groups`` runs torchft's Lighthouse and replica groups of one CPU rank each
(``dpteach/training/fault_tolerant.py``), kills one group with ``SIGKILL`` mid-run, and has a spare take its
place: the survivor trains on alone (the dead group drops out of the quorum once the Lighthouse misses its
heartbeat), and the spare recovers the job's state live from it, then trains beside it. Every process is
started as ``python -c`` would start it, forked from a process that has imported torch already
(``dpteach/ranks/zygote.py``).
"""
from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from .. import validate
from ..ranks.zygote import popen_python
from ..ranks.processes import child_job_env


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
    return popen_python(["-c", code], child_job_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


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
    env = child_job_env()
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
