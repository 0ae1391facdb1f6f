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
import contextlib
import importlib
import json
import os
import runpy
import select
import signal
import socket
import sys
import traceback

from dpteach.ranks.zygote import MAX_MESSAGE, PRELOAD, PRELOAD_IF_INSTALLED, import_time_env


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
        import torch
        import torch.distributed as dist

        dist.set_debug_level_from_env()  # read at import, in the zygote; this child may ask for another level
        if env.get("OMP_NUM_THREADS") == "1":  # as a fresh process started with it (zygote.py, "read at import")
            torch.set_num_threads(1)
        if argv is None:
            from dpteach.ranks import worker

            code = worker.main()
        else:
            code = _run_python(argv)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # never return into the zygote's loop


def _guest_refusal(request: dict, start_env: dict, retiring: bool) -> str | None:
    """Why a guest's request may not be forked here (None: it may): the zygote is retiring, or the guest's
    environment would have made an interpreter import torch differently from this one."""
    if retiring:
        return "this zygote is retiring"
    theirs = import_time_env(request["env"])
    differ = sorted(k for k in set(theirs) | set(start_env) if theirs.get(k) != start_env.get(k))
    if differ:
        return "its environment differs in a variable read at import: " + ", ".join(differ[:5])
    if request.get("argv") is None:
        return "a guest asks for a program (argv), not a rank"
    return None


def serve(sock: socket.socket, guest_path: str | None = None) -> None:
    """The zygote's loop: fork a child per request, report each child's exit, end when the launcher does.

    Besides its launcher, the zygote takes requests from *guests* on ``guest_path`` (a Unix socket in a folder
    only this user can enter): a worker that torchrun starts as ``python -m dpteach.ranks.zygote_guest ...``
    asks for itself to be forked here (``zygote_guest.py``). A guest's child is killed when the guest goes."""
    start_env = import_time_env(dict(os.environ))  # this zygote's key: what a guest's environment must match
    listener = None
    if guest_path:  # bound before the imports: a guest that comes early waits in the queue, not in vain
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(guest_path)
        listener.listen(16)
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
    guests: set[socket.socket] = set()
    children: dict[int, socket.socket] = {}  # pid -> the connection that asked for it
    retiring = False
    while True:
        ready, _, _ = select.select([sock, wake_read, *([listener] if listener else []), *guests], [], [])
        if wake_read in ready:
            while True:
                try:
                    os.read(wake_read, 512)
                except BlockingIOError:
                    break
        while True:  # reap every child that has ended, and tell whoever asked for it
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            asker = children.pop(pid, sock)
            try:
                asker.send(f"exited {pid} {os.waitstatus_to_exitcode(status)}".encode())
            except OSError:
                pass  # a guest that has gone
        if retiring and not children:
            return
        if listener is not None and listener in ready:
            guests.add(listener.accept()[0])
        for connection in [c for c in (sock, *guests) if c in ready]:
            message, fds, _, _ = socket.recv_fds(connection, MAX_MESSAGE, 2)
            if not message:
                if connection is sock:
                    return  # the launcher is gone
                guests.discard(connection)  # a guest is gone: so is what it asked for
                for pid in [p for p, c in children.items() if c is connection]:
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                connection.close()
                continue
            if message == b"retire":
                retiring = True
                if not children:
                    return
                continue
            request = json.loads(message)
            refusal = None if connection is sock else _guest_refusal(request, start_env, retiring)
            if refusal:  # the guest then runs as a fresh interpreter (zygote_guest.py)
                for fd in fds:
                    os.close(fd)
                connection.send(f"refused {request['number']} {refusal}".encode())
                continue
            pid = os.fork()
            if pid == 0:
                _become(request, fds[0], fds[1], [sock.fileno(), wake_read, wake_write,
                                                  *([listener.fileno()] if listener else []),
                                                  *(g.fileno() for g in guests)])
            for fd in fds:
                os.close(fd)
            children[pid] = connection
            connection.send(f"started {request['number']} {pid}".encode())


if __name__ == "__main__":
    guest_path = sys.argv[2] if len(sys.argv) > 2 else None
    try:
        serve(socket.socket(fileno=int(sys.argv[1])), guest_path)
    finally:  # the launcher made the folder; whichever of the two ends last leaves nothing behind
        if guest_path:
            with contextlib.suppress(OSError):
                os.unlink(guest_path)
            with contextlib.suppress(OSError):  # also when the socket was gone already
                os.rmdir(os.path.dirname(guest_path))
