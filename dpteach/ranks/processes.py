"""The processes of one :func:`dpteach.launch`: start W ranks, watch them, collect, clean up.

Each rank runs ``worker.main()``, forked from the zygote on CPU (``zygote.py``; milliseconds) or as a fresh
``python -m dpteach.ranks.worker`` on GPUs; it is given the function by value in a file and
its place in the world in its environment. They meet at a TCP store this process opens on a port the OS
picks. The launcher then watches three things at once - a result file per rank, each process's exit, and
the clock - and the first failure (an exception in a rank, a rank that died, the timeout) stops every rank's
process group and comes home as a :class:`RankError` or ``TimeoutError`` naming the rank and why.
``launcher.py`` lists what this promises; ``rank_output.py`` shows the ranks' output as they run.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta

import cloudpickle
import torch.distributed as dist

from .backend import cores_of_rank
from .gpus import settings_for_ranks
from .rank_output import RankOutput
from .world import World
from .zygote import fork_rank, prestart, use_zygote


class RankError(RuntimeError):
    """A rank raised an exception or died. ``rank``, ``exit_code`` and ``rank_traceback`` say how.

    ``last_output`` holds the rank's last lines of output: for a rank that died without a Python
    traceback (a native abort, a signal) they are often the only explanation, e.g. gloo's
    "Received data size doesn't match expected size" before a SIGABRT.
    """

    def __init__(self, rank: int, message: str, rank_traceback: str = "", exit_code: int | None = None,
                 exc_type: str | None = None, while_joining: bool = False, last_output: tuple[str, ...] = ()):
        self.rank, self.rank_traceback, self.exit_code, self.exc_type = rank, rank_traceback, exit_code, exc_type
        self.while_joining = while_joining  # raised while the world was being formed, before fn ran
        self.last_output = tuple(last_output)
        text = f"rank {rank} {message}"
        if rank_traceback:
            text += f"\n\n--- traceback from rank {rank} ---\n{rank_traceback.rstrip()}"
        elif self.last_output:
            text += f"\n\n--- last output of rank {rank} ---\n" + "\n".join(self.last_output)
        super().__init__(text)


def rank_start_env(extra_env: dict | None = None) -> dict:
    """A rank's environment before its place in the world is added: the caller's, ``extra_env``, unbuffered output.

    torch's profiler (Kineto) prints a "USDT: ... profiler_start" line at every start and stop, at a log level
    above its errors: the lessons that read a rank's collectives from a profile would fill the learner's output
    with them. Kineto's threshold cannot keep errors and drop these, so a rank starts with its log off unless the
    user set KINETO_LOG_LEVEL (the profiler's failures still raise)."""
    env = {**os.environ, **(extra_env or {}), "PYTHONUNBUFFERED": "1"}
    env.setdefault("KINETO_LOG_LEVEL", "6")
    return env


# torchrun gives each worker one thread when it starts more than one per node and OMP_NUM_THREADS is unset
# (torch/distributed/run.py); lesson 13's untouched runs, compared with its torchrun jobs, have one thread too.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def child_job_env(env: dict | None = None) -> dict:
    """The environment of a job a lesson starts as a child (a torchrun agent, torchft's groups): a rank's with one
    thread (``rank_start_env``), plus ``env``, and never the world of a notebook that itself runs under torchrun
    (nor its debug setting, unless ``env`` asks for one). Being a rank's, it selects the zygote that ranks are
    forked from, so a torchrun agent, its forked workers and ``launch(..., env=ONE_THREAD)``'s ranks share it."""
    result = rank_start_env({**ONE_THREAD, **(env or {})})
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCH_DISTRIBUTED_DEBUG"):
        if name not in (env or {}):
            result.pop(name, None)
    return result


def warm_up() -> None:
    """Start the zygote CPU ranks are forked from now, in the background (``zygote.prestart``): a notebook that
    imports the panels will launch ranks, and the zygote's imports then overlap the notebook's own."""
    if use_zygote("cpu"):
        prestart(rank_start_env())


def _signal_name(number: int) -> str:
    try:
        return f"{signal.Signals(number).name} (signal {number})"
    except ValueError:
        return f"signal {number}"


class RankProcesses:
    """The processes of one launch, from start to clean-up: each rank a process leading its own
    process group, watched until every result is in, one fails, or time runs out; then nothing is left."""

    def __init__(self, world: World, payload, timeout, show_output, progress, env):
        self.world_size, self.placement, self.timeout = world.size, world.placement, float(timeout)
        self.extra_env = env
        self.nccl_env = settings_for_ranks(self.placement)  # what this machine's GPUs need (gpus.py), said once
        self.output = RankOutput(world.size, show_output, progress)
        self.tmp = tempfile.mkdtemp(prefix="dpteach-launch-")
        self.payload_path = os.path.join(self.tmp, "payload.pkl")
        with open(self.payload_path, "wb") as f:
            f.write(payload)
        self.procs: list[subprocess.Popen] = []
        self.readers: list[threading.Thread] = []
        self.store = None

    # -- life cycle ----------------------------------------------------------------------------
    def run(self) -> list:
        try:
            self.store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=self.timeout),
                                       wait_for_workers=False)
            for rank in range(self.world_size):
                self._start(rank)
            self._wait()
            return self._collect()
        finally:
            self._stop_all()
            self.output.drain()
            self.output.close()
            for t in self.readers:
                t.join(timeout=2)
            self.store = None
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _start(self, rank: int) -> None:
        cpus = os.cpu_count() or 1
        env = rank_start_env(self.extra_env)
        env.update({
            "RANK": str(rank), "WORLD_SIZE": str(self.world_size), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(self.world_size), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(self.store.port), "DPTEACH_PROGRESS_PORT": str(self.store.port),
            "DPTEACH_PARENT_PID": str(os.getpid()), "DPTEACH_LAUNCHER_PID": str(os.getpid()),
            "DPTEACH_PAYLOAD": self.payload_path,
            "DPTEACH_RESULT": os.path.join(self.tmp, f"rank{rank}.pkl"),
            "DPTEACH_BACKEND": self.placement.process_group_backend, "DPTEACH_DEVICE": self.placement.device_for(rank),
            "DPTEACH_TIMEOUT": str(self.timeout), "DPTEACH_SYS_PATH": json.dumps(sys.path),
        })
        env.update(self.placement.rank_env(rank, str(self.store.port)))
        env.update({k: v for k, v in self.nccl_env.items() if k not in env})  # a value the caller set wins
        # W ranks share the cores: without this each would start one thread per core and they
        # would trample each other (a user's OMP_NUM_THREADS, in the environment or in env=, still wins). A rank pinned to its own
        # cores runs exactly one thread per core it holds: two threads on one core spin-wait for each
        # other, which made a lone rank train many times slower than a plain process.
        cores = cores_of_rank(rank, self.world_size, self.placement.device_type)
        if "OMP_NUM_THREADS" not in env:
            env["DPTEACH_THREADS"] = str(len(cores) if cores else max(1, cpus // self.world_size))
        if cores:
            env["DPTEACH_CORES"] = ",".join(map(str, cores))
        if use_zygote(self.placement.device_type):  # a fork of a process that has imported torch already
            proc = fork_rank(env, os.getcwd())
        else:
            proc = subprocess.Popen([sys.executable, "-u", "-m", "dpteach.ranks.worker"], env=env,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    start_new_session=True, cwd=os.getcwd())
        self.procs.append(proc)
        reader = threading.Thread(target=self.output.read, args=(rank, proc.stdout), daemon=True)
        reader.start()
        self.readers.append(reader)

    def _wait(self) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            self.output.drain()
            self.output.update(self.store)
            codes = [p.poll() for p in self.procs]
            # Exit code 0 without a result is a failure too: the rank ended its own process (os._exit(0),
            # or a library that exits) before fn returned - its peers would otherwise wait for it forever.
            failed = [r for r, c in enumerate(codes) if c not in (None, 0) or (c == 0 and not self._has_result(r))]
            if failed:
                self._raise_failure(failed)
            if all(c == 0 for c in codes):
                self.output.update(self.store)  # what the ranks reported between the last look and their exit
                return
            if time.monotonic() > deadline:
                running = [r for r, c in enumerate(codes) if c is None]
                self._stop_all()
                raise TimeoutError(f"rank(s) {running} of {self.world_size} did not finish within "
                                   f"{self.timeout:g} s and were stopped (raise timeout= if the work "
                                   f"is just slow, or look for a deadlock: a send with no matching recv)")
            time.sleep(0.02)

    def _raise_failure(self, failed: list[int]) -> None:
        # When one rank fails, its peers usually fail a moment later *because* it is gone
        # ("connection closed by peer"). Give them a second to finish failing, then report the
        # cause: a rank that died without a result, else the rank whose exception came first.
        observed = {r: time.time() for r in failed}
        end = time.monotonic() + 1.0
        while time.monotonic() < end and any(p.poll() is None for p in self.procs):
            for r, p in enumerate(self.procs):
                if r not in observed and p.poll() is not None and (p.poll() != 0 or not self._has_result(r)):
                    observed[r] = time.time()
            time.sleep(0.02)
        self._stop_all()
        outcomes = {r: self._outcome(r) for r in observed}
        died = sorted((t, r) for r, t in observed.items() if outcomes[r] is None)
        raised = sorted((o["failed_at"], r) for r, o in outcomes.items() if o is not None and not o["ok"])
        crashed_after = sorted((t, r) for r, t in observed.items() if outcomes[r] is not None and outcomes[r]["ok"])
        rank = (died or raised or crashed_after)[0][1]
        outcome, code = outcomes[rank], self.procs[rank].returncode
        others = "; the other ranks were stopped" if self.world_size > 1 else ""
        how = f"killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
        if code == 0:
            how = "ended its own process (exit code 0)"
        if code == -signal.SIGKILL:  # nobody here sent it: almost always the out-of-memory killer
            how += ": usually the out-of-memory killer - try fewer ranks or a smaller model"
        if outcome is None:
            self.readers[rank].join(timeout=1.0)  # its last lines may still be in the pipe
            self.output.drain()
            raise RankError(rank, f"{how} without returning a result{others}", exit_code=code,
                            last_output=tuple(self.output.last_lines[rank]))
        if outcome["ok"]:  # the work was done, but the process did not end cleanly
            raise RankError(rank, f"returned its result, then {how} while shutting down{others}", exit_code=code)
        err = RankError(rank, f"raised {outcome['type']}: {outcome['message']}{others}",
                        outcome["traceback"], code, outcome["type"], outcome.get("while_joining", False))
        raise err from outcome.get("exception")

    def _has_result(self, rank: int) -> bool:
        return os.path.exists(os.path.join(self.tmp, f"rank{rank}.pkl"))

    def _outcome(self, rank: int):
        path = os.path.join(self.tmp, f"rank{rank}.pkl")
        if not os.path.exists(path):
            return None
        with open(path, "rb") as f:
            return cloudpickle.load(f)

    def _collect(self) -> list:
        results = []
        for rank in range(self.world_size):
            outcome = self._outcome(rank)
            if outcome is None or not outcome["ok"]:
                raise RankError(rank, "finished without writing a result", exit_code=0)
            results.append(outcome["value"])
        return results

    def _stop_all(self) -> None:
        alive = [p for p in self.procs if p.poll() is None]
        for sig, grace in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
            for p in alive:
                try:
                    os.killpg(p.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            end = time.monotonic() + grace
            while time.monotonic() < end and any(p.poll() is None for p in alive):
                time.sleep(0.02)
            alive = [p for p in alive if p.poll() is None]
            if not alive:
                break
        for p in self.procs:  # also reap whatever the ranks themselves started
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
