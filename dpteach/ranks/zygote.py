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

What a forked rank is, step by step (``_become_rank``)::

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
* A variable read while torch is imported (``OMP_NUM_THREADS``, ``TORCH_CPP_LOG_LEVEL``, ...) must have
  the value the rank would have seen. The zygote is keyed by every variable except those read later
  (``READ_AFTER_START``): a launch whose environment differs in one of them gets a zygote of its own.
* CUDA cannot be used in a child forked from a process that initialised it, and this course has no
  GPU to test forked NCCL ranks on: GPU worlds keep fresh interpreters (``use_zygote``), as do
  macOS and Windows (fork with torch loaded is unsafe on macOS; Windows has no fork), and any launch
  with ``DPTEACH_FRESH_RANKS=1`` in the environment.
* A rank still cannot outlive its launcher: the zygote exits when the launcher's end of the socket
  closes, and each rank exits when its parent (the zygote) is gone (``worker._exit_when_orphaned``).
"""
from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading

# Read by the rank after it starts (the worker, torch.distributed at init_process_group, or re-read by
# _become_rank below), so ranks of one zygote may differ in them. Every other variable keys the zygote.
READ_AFTER_START = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                    "TORCH_DISTRIBUTED_DEBUG", "PYTEST_CURRENT_TEST")
READ_AFTER_START_PREFIXES = ("DPTEACH_",)
# What every rank imports sooner or later; torch._dynamo alone is over a second of CPU (a torch
# optimizer or DDP imports it on construction).
PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "torch.nn.parallel", "torch.distributed.checkpoint",
           "cloudpickle", "dpteach.ranks.worker", "dpteach.ranks.backend")
MAX_MESSAGE = 1 << 20


def use_zygote(device_type: str) -> bool:
    """Whether ranks on ``device_type`` are forked from a zygote (else: fresh interpreters)."""
    return (device_type == "cpu" and sys.platform.startswith("linux")
            and os.environ.get("DPTEACH_FRESH_RANKS", "") in ("", "0"))


def _key(env: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in env.items()
                        if k not in READ_AFTER_START and not k.startswith(READ_AFTER_START_PREFIXES)))


# -- the launcher's side ---------------------------------------------------------------------------
class ForkedRank:
    """A rank forked by the zygote, seen the way :class:`subprocess.Popen` shows a child."""

    def __init__(self, zygote: "Zygote", pid: int, stdout):
        self.zygote, self.pid, self.stdout, self.returncode = zygote, pid, stdout, None

    def poll(self):
        if self.returncode is None:
            self.returncode = self.zygote.exit_code(self.pid)
        return self.returncode


class Zygote:
    """The launcher's handle on one zygote process; ``fork(env, cwd)`` starts a rank."""

    def __init__(self, env: dict):
        self.key = _key(env)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.process = subprocess.Popen([sys.executable, "-u", "-m", "dpteach.ranks.zygote", str(theirs.fileno())],
                                        env=env, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                        start_new_session=True)
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

    def fork(self, env: dict, cwd: str) -> ForkedRank:
        """Start one rank with environment ``env`` in folder ``cwd``; its output comes out of ``.stdout``."""
        read_end, write_end = os.pipe()
        try:
            with self.lock:
                self.requests += 1
                number = self.requests
                request = json.dumps({"number": number, "env": env, "cwd": cwd}).encode()
                socket.send_fds(self.sock, [request], [write_end])
            with self.changed:
                if not self.changed.wait_for(lambda: number in self.started or not self.alive, timeout=30):
                    raise RuntimeError("the rank zygote did not answer within 30 s")
                if number not in self.started:
                    raise RuntimeError(f"the rank zygote exited (code {self.process.poll()}) before forking a rank")
                pid = self.started.pop(number)
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)  # the rank holds its own copy: the pipe ends when the rank does
        return ForkedRank(self, pid, os.fdopen(read_end, "rb"))

    def exit_code(self, pid: int):
        with self.changed:
            if pid in self.exits:
                return self.exits.pop(pid)
            if not self.alive:
                return 70  # the zygote died: its ranks exit with the worker's "orphaned" code
            return None

    def usable_for(self, env: dict) -> bool:
        return self.alive and self.process.poll() is None and _key(env) == self.key

    def retire(self) -> None:
        """Fork no more; the zygote exits once the ranks it forked have ended (a launch may still be using them)."""
        with self.lock:
            try:
                self.sock.send(b"retire")
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()  # the zygote sees the socket close and exits at once; so do its ranks, orphaned


_zygotes: list[Zygote] = []  # the most recently used last; at most two are kept
_retired: list[Zygote] = []  # kept until they exit, so that their sockets stay open
_zygotes_lock = threading.Lock()


def fork_rank(env: dict, cwd: str) -> ForkedRank:
    """Fork a rank with environment ``env`` from a zygote started with the same import-time environment."""
    with _zygotes_lock:
        zygote = next((z for z in _zygotes if z.usable_for(env)), None)
        if zygote is None:
            start_env = {k: v for k, v in env.items()
                         if k not in READ_AFTER_START and not k.startswith(READ_AFTER_START_PREFIXES)}
            start_env["DPTEACH_LAUNCHER_PID"] = str(os.getpid())  # marks the zygote and its ranks in /proc
            zygote = Zygote(start_env)
            while len(_zygotes) >= 2:
                _zygotes[0].retire()
                _retired.append(_zygotes.pop(0))
            _retired[:] = [z for z in _retired if z.alive]
        else:
            _zygotes.remove(zygote)
        _zygotes.append(zygote)
    return zygote.fork(env, cwd)


@atexit.register
def _close_all() -> None:
    for zygote in _zygotes + _retired:
        zygote.close()


# -- the zygote's side -----------------------------------------------------------------------------
def _become_rank(request: dict, output_fd: int, inherited: list[int]) -> None:
    """In the forked child: turn the zygote's copy into the rank the request describes; never returns."""
    code = 1
    try:
        os.setsid()  # leads its own process group: the launcher stops a rank and what it started together
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in inherited:
            os.close(fd)
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        os.dup2(output_fd, 1)
        os.dup2(output_fd, 2)
        os.close(stdin)
        os.close(output_fd)
        os.chdir(request["cwd"])
        env = dict(request["env"])
        try:  # `ps -o comm` and `top` tell the ranks from their zygote (the command line stays the zygote's)
            with open("/proc/self/comm", "w") as comm:
                comm.write(f"dpteach-rank{env.get('RANK', '')}")
        except OSError:
            pass
        env["DPTEACH_PARENT_PID"] = str(os.getppid())  # the process whose end ends this rank: the zygote
        os.environ.clear()
        os.environ.update(env)
        import torch.distributed as dist

        dist.set_debug_level_from_env()  # read at import, in the zygote; this rank may ask for another level
        from dpteach.ranks import worker

        code = worker.main()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # never return into the zygote's loop


def serve(sock: socket.socket) -> None:
    """The zygote's loop: fork a rank per request, report each rank's exit, end when the launcher does."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake select(): children are reaped below
    children, retiring = set(), False
    while True:
        ready, _, _ = select.select([sock, wake_read], [], [])
        if wake_read in ready:
            while True:
                try:
                    os.read(wake_read, 512)
                except BlockingIOError:
                    break
        while True:  # reap every child that has ended, and say so
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            children.discard(pid)
            sock.send(f"exited {pid} {os.waitstatus_to_exitcode(status)}".encode())
        if retiring and not children:
            return
        if sock in ready:
            message, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 1)
            if not message:
                return  # the launcher is gone
            if message == b"retire":
                retiring = True
                if not children:
                    return
                continue
            request = json.loads(message)
            pid = os.fork()
            if pid == 0:
                _become_rank(request, fds[0], [sock.fileno(), wake_read, wake_write])
            os.close(fds[0])
            children.add(pid)
            sock.send(f"started {request['number']} {pid}".encode())


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
