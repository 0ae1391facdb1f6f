"""The zygote's own side (``python -m dpteach.ranks.zygote_server FD``): import once, then fork on request.

``zygote.py`` explains why and holds the launcher's side; this file is what runs in the zygote. Its loop
waits on two things with ``select``: the launcher's socket (a request: fork; the socket closed: exit) and a
pipe that ``SIGCHLD`` writes to (a child ended: reap it and tell the launcher its exit code). The zygote
stays single-threaded and never computes, so that a fork of it is safe.

A request is JSON and comes with two descriptors, the child's stdout and stderr (one pipe twice for a rank).
Without ``argv`` the child becomes a rank (``worker.main()``); with ``argv`` it becomes what
``python ARGV...`` would be - ``["-m", module, args...]`` or ``["-c", code, args...]`` - for the lesson
jobs that start torch processes of their own (a torchrun agent, torchft's replica groups).
"""
from __future__ import annotations

import atexit
import importlib
import json
import os
import runpy
import select
import signal
import socket
import sys
import traceback

from dpteach.ranks.zygote import MAX_MESSAGE, PRELOAD, PRELOAD_IF_INSTALLED


def _run_python(argv: list[str]) -> int:
    """Do what ``python *argv`` does, in this already-started interpreter; return its exit code."""
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        else:
            raise ValueError(f"argv={argv!r}: the zygote runs only '-m module' or '-c code'")
        code = 0
    except SystemExit as done:  # what `python` turns sys.exit(...) into
        code = done.code if isinstance(done.code, int) else 0 if done.code is None else 1
        if done.code is not None and not isinstance(done.code, int):
            print(done.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()  # what a normal interpreter exit runs (logging's flush, the program's own handlers)
    return code


def _become(request: dict, stdout_fd: int, stderr_fd: int, inherited: list[int]) -> None:
    """In the forked child: turn the zygote's copy into what the request describes; never returns."""
    code = 1
    try:
        os.setsid()  # leads its own process group: the launcher stops a rank and what it started together
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in inherited:
            os.close(fd)
        stdin = os.open(os.devnull, os.O_RDONLY)
        for source, target in ((stdin, 0), (stdout_fd, 1), (stderr_fd, 2)):
            os.dup2(source, target)
        for fd in {stdin, stdout_fd, stderr_fd}:
            if fd > 2:
                os.close(fd)
        os.chdir(request["cwd"])
        env = dict(request["env"])
        argv = request.get("argv")
        if argv is None:
            env["DPTEACH_PARENT_PID"] = str(os.getppid())  # the process whose end ends this rank: the zygote
        try:  # `ps -o comm` and `top` tell the ranks from their zygote (the command line stays the zygote's)
            with open("/proc/self/comm", "w") as comm:
                comm.write(f"dpteach-rank{env.get('RANK', '')}" if argv is None else "dpteach-forked")
        except OSError:
            pass
        os.environ.clear()
        os.environ.update(env)
        import torch.distributed as dist

        dist.set_debug_level_from_env()  # read at import, in the zygote; this child may ask for another level
        if argv is None:
            from dpteach.ranks import worker

            code = worker.main()
        else:
            code = _run_python(argv)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # never return into the zygote's loop


def serve(sock: socket.socket) -> None:
    """The zygote's loop: fork a child per request, report each child's exit, end when the launcher does."""
    for name in PRELOAD:
        importlib.import_module(name)
    for name in PRELOAD_IF_INSTALLED:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
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
            message, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 2)
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
                _become(request, fds[0], fds[1], [sock.fileno(), wake_read, wake_write])
            for fd in fds:
                os.close(fd)
            children.add(pid)
            sock.send(f"started {request['number']} {pid}".encode())


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
