"""``dpteach profile``: run a training command as it is and collect a trace of a few steps from every rank.

The command is not edited: ``boot/`` goes first on its ``PYTHONPATH``, so every Python process it starts -
torchrun's workers, ``mp.spawn``'s children, a plain ``python train.py`` - runs ``boot/sitecustomize.py`` at
start-up, which hooks that process's optimizer steps (``recorder.py``). The launcher itself is left alone:
a process that never calls ``optimizer.step()`` never starts a profiler.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

from .. import validate
from .recorder import ENV_DIR, ENV_SKIP, ENV_STEPS

BOOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "boot")


def profile_command(command: list[str], out: str = "traces", steps: int = 5, skip: int = 3,
                    timeout: float | None = None, quiet: bool = False) -> dict:
    """Run ``command`` (a list, as for ``subprocess``) with every rank recording ``steps`` optimizer steps after
    ``skip`` into ``out/rank{R}.json``. Returns ``{"out", "traces", "returncode"}``; raises ``RuntimeError``
    when the command fails or no rank wrote a trace."""
    if not isinstance(command, (list, tuple)) or not command or not all(isinstance(a, str) for a in command):
        raise validate.refusal("command", command, "it must be a non-empty list of strings, e.g. "
                               "['torchrun', '--nproc-per-node', '2', 'train.py']")
    if shutil.which(command[0]) is None and not os.path.exists(command[0]):
        raise validate.refusal("command", command[0], "it must be a program on PATH or a path to one")
    validate.integer("steps", steps, low=1, high=100, why=" (a few steps describe a job; traces grow fast)")
    validate.integer("skip", skip, low=0)
    validate.optional(validate.number, "timeout", timeout, above=0, unit="seconds")
    if os.path.exists(out) and not os.path.isdir(out):
        raise validate.refusal("out", out, "it must be a folder (it is a file)")
    os.makedirs(out, exist_ok=True)
    for old in glob.glob(os.path.join(out, "rank*.json")):  # an earlier recording's: never mixed with this one
        os.remove(old)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([BOOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update({ENV_DIR: os.path.abspath(out), ENV_STEPS: str(steps), ENV_SKIP: str(skip)})
    output = subprocess.DEVNULL if quiet else None
    completed = subprocess.run(list(command), env=env, timeout=timeout, stdout=output, stderr=output)
    traces = sorted(glob.glob(os.path.join(out, "rank*.json")))
    if completed.returncode != 0:
        raise RuntimeError(f"the command exited with code {completed.returncode}; {len(traces)} trace(s) written")
    if not traces:
        raise RuntimeError(f"no rank wrote a trace: did the script call optimizer.step() at least "
                           f"{skip + 1 + steps} times (skip {skip}, 1 warm-up, {steps} recorded)? "
                           f"Use fewer --steps/--skip, or record with dpteach.profiling.record_steps in the script")
    return {"out": os.path.abspath(out), "traces": traces, "returncode": completed.returncode}


def torchrun(script_args: list[str], nproc: int) -> list[str]:
    """``python -m torch.distributed.run --nproc-per-node N ...`` with this interpreter (torchrun, on any PATH)."""
    validate.integer("nproc", nproc, low=1)
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), *script_args]
