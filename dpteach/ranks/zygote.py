"""A process that has imported torch once and forks a rank whenever a launch asks for one.

Starting a rank used to mean starting a fresh interpreter that imports torch: about a second of CPU,
and more again the first time the rank builds an optimizer or DDP (that imports ``torch._dynamo``).
On a laptop's two cores a launch of 2 ranks took 1.3 s and one of 4 ranks 2.5 s before any rank ran
a line of the learner's code, and a lesson or the test suite launches many worlds. So the launcher
keeps a *zygote* (the name comes from Android, which starts apps the same way): one helper process,
started at the first launch, that imports torch and the modules ranks use, and then only waits.
For each rank the launcher sends it the rank's environment and a pipe for its output; the zygote
forks, and the child becomes the rank. A fork copies the imported modules instead of importing them
again: a rank starts in milliseconds.

What a forked rank is, step by step (``zygote_server._become``)::

    launcher ── request: env, cwd, pipe ──▶ zygote (torch imported, one thread, never ran a kernel)
                                              │ fork
                                              ▼
                                            child: new session (leads its own process group, as before),
                                                   stdout+stderr -> the pipe, stdin -> /dev/null,
                                                   chdir, os.environ = the rank's environment,
                                                   worker.main() - exactly what a fresh rank runs
    launcher ◀── "started <pid>" ─────────── zygote
    launcher ◀── "exited <pid> <code>" ───── zygote (it is the child's parent, so it reaps it)

Why this is safe, and when it is not used:

* The zygote never computes: no torch operator, no thread pool, no CUDA. Forking a process that has
  started threads can leave a lock held forever in the child; an idle import is safe to fork. (numpy's
  OpenBLAS starts idle threads at import; OpenBLAS stops them around ``fork`` itself.)
* A variable read while torch is imported (``TORCH_CPP_LOG_LEVEL``, ``MKL_NUM_THREADS``, ...) must have
  the value the rank would have seen. The zygote is keyed by every variable except those read later
  (``READ_AFTER_START``): a launch whose environment differs in one of them gets a zygote of its own.
  One is read at import and yet does not key it: ``OMP_NUM_THREADS=1``, which torchrun gives its workers.
  The OpenMP runtime reads it when torch loads it, but the child applies it with ``torch.set_num_threads(1)``
  before it runs anything (``zygote_server._become``), which gives torch's intra-op pool, OpenMP and MKL
  the one thread a fresh process would have (the way every rank already sets its threads, ``worker.py``).
  Other counts key a zygote: a fresh process caps them at the physical cores (MKL's maximum), and
  ``set_num_threads`` would not.
* CUDA cannot be used in a child forked from a process that initialised it, and this course has no
  GPU to test forked NCCL ranks on: GPU worlds keep fresh interpreters (``use_zygote``), as do
  macOS and Windows (fork with torch loaded is unsafe on macOS; Windows has no fork), and any launch
  with ``DPTEACH_FRESH_RANKS=1`` in the environment.
* A rank still cannot outlive its launcher: the zygote exits when the launcher's end of the socket
  closes, and each rank exits when its parent (the zygote) is gone (``worker._exit_when_orphaned``).

The same zygote also starts the other torch processes a lesson runs (``popen_python``: a torchrun agent,
torchft's Lighthouse and replica groups) as ``python -m ...`` or ``python -c ...`` would: what they then
start themselves - torchrun's workers - are fresh interpreters as always.
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

# Read by the child after it starts (the worker, torch.distributed at init_process_group, or re-read by
# ``zygote_server._become``), so children of one zygote may differ in them. Every other variable keys the zygote.
READ_AFTER_START = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                    "TORCH_DISTRIBUTED_DEBUG", "PYTEST_CURRENT_TEST",
                    # what torchrun's agent adds for its workers (local_elastic_agent.py, _start_workers)
                    "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE",
                    "TORCH_NCCL_ASYNC_ERROR_HANDLING")
READ_AFTER_START_PREFIXES = ("DPTEACH_", "TORCHELASTIC_")
GUEST_SOCKET = "DPTEACH_ZYGOTE_SOCKET"  # where a program forked by a zygote finds it again (zygote_guest.py)
# What every rank imports sooner or later; torch._dynamo alone is over a second of CPU (a torch
# optimizer or DDP imports it on construction).
PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "torch.nn.parallel", "torch.distributed.checkpoint",
           "cloudpickle", "dpteach.ranks.worker", "dpteach.ranks.backend")
PRELOAD_IF_INSTALLED = ("torchft", "torchft.checkpointing.pg_transport")  # lesson 13's replica groups
MAX_MESSAGE = 1 << 20
FIRST_FORK_TIMEOUT = 300.0  # the first fork waits for the zygote's imports: seconds, far more on a busy machine


def use_zygote(device_type: str = "cpu") -> bool:
    """Whether processes for ``device_type`` are forked from a zygote (else: fresh interpreters)."""
    return (device_type == "cpu" and sys.platform.startswith("linux")
            and os.environ.get("DPTEACH_FRESH_RANKS", "") in ("", "0"))


def import_time_env(env: dict) -> dict:
    """The part of ``env`` that a process reads while it imports torch: what keys a zygote."""
    return {k: v for k, v in env.items() if k not in READ_AFTER_START and not k.startswith(READ_AFTER_START_PREFIXES)
            and not (k == "OMP_NUM_THREADS" and v == "1")}


# -- a child of the zygote, seen the way subprocess.Popen shows a child ----------------------------------------
class ForkedProcess:
    def __init__(self, zygote: "Zygote", pid: int, args, stdout=None):
        self.zygote, self.pid, self.args, self.stdout, self.returncode = zygote, pid, args, stdout, None

    def poll(self):
        if self.returncode is None:
            self.returncode = self.zygote.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The launcher's handle on one zygote process; ``fork`` starts a child of it."""

    def __init__(self, env: dict):
        self.key = tuple(sorted(env.items()))
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.folder = tempfile.mkdtemp(prefix="dpteach-zygote-")  # mode 0700: only this user reaches the socket
        self.guest_path = os.path.join(self.folder, "guests")
        self.process = subprocess.Popen(
            [sys.executable, "-u", "-m", "dpteach.ranks.zygote_server", str(theirs.fileno()), self.guest_path],
            env={**env, "DPTEACH_LAUNCHER_PID": str(os.getpid())},  # marks the zygote and its children in /proc
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        self.sock, self.lock = ours, threading.Lock()
        self.changed = threading.Condition()
        self.started: dict[int, int] = {}  # request number -> pid
        self.exits: dict[int, int] = {}    # pid -> exit code (negative: killed by that signal)
        self.alive, self.requests = True, 0
        threading.Thread(target=self._listen, daemon=True).start()

    def _listen(self) -> None:
        while True:
            try:
                message = self.sock.recv(MAX_MESSAGE)
            except OSError:
                message = b""
            with self.changed:
                if not message:  # the zygote is gone: ranks it forked exit on their own (orphaned)
                    self.alive = False
                    self.changed.notify_all()
                    return
                kind, *numbers = message.decode().split()
                if kind == "started":
                    self.started[int(numbers[0])] = int(numbers[1])
                elif kind == "exited":
                    self.exits[int(numbers[0])] = int(numbers[1])
                self.changed.notify_all()

    def fork(self, env: dict, cwd: str, stdout_fd: int, stderr_fd: int, argv: list[str] | None = None) -> int:
        """Fork a child with environment ``env`` in folder ``cwd`` writing to the two descriptors (which it
        keeps: the caller may close its own copies); a rank when ``argv`` is None. Returns its pid."""
        with self.lock:
            self.requests += 1
            number = self.requests
            request = json.dumps({"number": number, "env": env, "cwd": cwd, "argv": argv}).encode()
            socket.send_fds(self.sock, [request], [stdout_fd, stderr_fd])
        with self.changed:
            if not self.changed.wait_for(lambda: number in self.started or not self.alive, timeout=FIRST_FORK_TIMEOUT):
                raise RuntimeError(f"the zygote did not fork within {FIRST_FORK_TIMEOUT:g} s")
            if number not in self.started:
                raise RuntimeError(f"the zygote exited (code {self.process.poll()}) before it forked")
            return self.started.pop(number)

    def exit_code(self, pid: int):
        with self.changed:
            if pid in self.exits:
                return self.exits.pop(pid)
            if not self.alive:
                return 70  # the zygote died: its ranks exit with the worker's "orphaned" code
            return None

    def usable_for(self, env: dict) -> bool:
        return self.alive and self.process.poll() is None and tuple(sorted(import_time_env(env).items())) == self.key

    def retire(self) -> None:
        """Fork no more; the zygote exits once its children have ended (a launch may still be using them)."""
        with self.lock:
            try:
                self.sock.send(b"retire")
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()  # the zygote sees the socket close and exits at once; so do its ranks, orphaned
        shutil.rmtree(self.folder, ignore_errors=True)


_zygotes: list[Zygote] = []  # the most recently used last; at most two are kept
_retired: list[Zygote] = []  # kept until they exit, so that their sockets stay open
_zygotes_lock = threading.Lock()


def _zygote_for(env: dict) -> Zygote:
    """A zygote started with ``env``'s import-time variables: the one kept, or a new one."""
    with _zygotes_lock:
        zygote = next((z for z in _zygotes if z.usable_for(env)), None)
        if zygote is None:
            zygote = Zygote(import_time_env(env))
            while len(_zygotes) >= 2:
                _zygotes[0].retire()
                _retired.append(_zygotes.pop(0))
            _retired[:] = [z for z in _retired if z.alive]
        else:
            _zygotes.remove(zygote)
        _zygotes.append(zygote)
    return zygote


def prestart(env: dict) -> None:
    """Have a zygote for ``env`` started (it imports in the background; nothing waits for it here)."""
    _zygote_for(env)


def fork_rank(env: dict, cwd: str) -> ForkedProcess:
    """Fork a rank (``worker.main()``) with environment ``env``; its stdout and stderr come out of ``.stdout``."""
    zygote = _zygote_for(env)
    read_end, write_end = os.pipe()
    try:
        pid = zygote.fork(env, cwd, write_end, write_end)
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)  # the rank holds its own copy: the pipe ends when the rank does
    return ForkedProcess(zygote, pid, ["dpteach.ranks.worker"], os.fdopen(read_end, "rb"))


def popen_python(argv: list[str], env: dict, stdout=None, stderr=None, text: bool = False):
    """``subprocess.Popen([sys.executable, *argv], ...)`` for ``-m module ...`` or ``-c code ...``, forked from a
    zygote where ``use_zygote()`` (else that very Popen). ``stdout``/``stderr``: None (this process's), a file
    object, ``subprocess.DEVNULL``, ``subprocess.PIPE`` (stdout only; read ``.stdout``) or, for stderr,
    ``subprocess.STDOUT``."""
    if not use_zygote():
        return subprocess.Popen([sys.executable, *argv], env=env, stdout=stdout, stderr=stderr, text=text,
                                stdin=subprocess.DEVNULL)
    if stderr == subprocess.PIPE:
        raise ValueError("stderr=subprocess.PIPE is not supported here: use a file or subprocess.STDOUT")
    closing, pipe = [], None

    def descriptor(target, default: int) -> int:
        if target is None:
            return default
        if target == subprocess.DEVNULL:
            closing.append(os.open(os.devnull, os.O_WRONLY))
            return closing[-1]
        return target.fileno()

    if stdout == subprocess.PIPE:
        pipe = os.pipe()
        closing.append(pipe[1])
        out = pipe[1]
    else:  # None: this process's own descriptors 1 and 2, as Popen's child inherits them (sys.stdout may be a
        out = descriptor(stdout, 1)  # notebook's stream with no descriptor at all)
    err = out if stderr == subprocess.STDOUT else descriptor(stderr, 2)
    try:
        zygote = _zygote_for(env)
        # what it starts can find this zygote again: torchrun's workers, as ``zygote_guest`` (``forked_python``)
        pid = zygote.fork({**env, GUEST_SOCKET: zygote.guest_path}, os.getcwd(), out, err, argv=list(argv))
    except BaseException:
        if pipe:
            os.close(pipe[0])
        raise
    finally:
        for fd in closing:
            os.close(fd)
    reader = None if pipe is None else os.fdopen(pipe[0], "r" if text else "rb")
    return ForkedProcess(zygote, pid, [sys.executable, *argv], reader)


@atexit.register
def _close_all() -> None:
    for zygote in _zygotes + _retired:
        zygote.close()
