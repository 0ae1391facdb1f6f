"""Run a program forked from the zygote that started this process's parent: ``python -m dpteach.ranks.zygote_guest
-m MODULE ARGS...`` behaves as ``python -u -m MODULE ARGS...``, only without importing torch again.

Lesson 13 runs torchrun as a learner would, and torchrun starts each worker as a fresh interpreter: on a
laptop's two cores that is two seconds of ``import torch`` per worker, and a restart pays it again. Given
``--no-python python -m dpteach.ranks.zygote_guest`` before its module, torchrun starts this small program
instead (it imports nothing of torch), which asks the zygote (``zygote.py``) to fork the real worker with this
process's environment, working folder, stdout and stderr, and then stands in for it, so that torchrun's agent
sees what it would have seen:

* a signal sent to this process (torchrun stops its workers with ``os.killpg(pid, SIGTERM)``) is passed on
  to the worker's own process group;
* when the worker ends, this process ends the same way: with the worker's exit code, or killed by the same
  signal (a worker killed with ``SIGKILL`` shows as ``exitcode: -9`` in torchrun's summary, as it would);
* if this process is killed outright, its socket closes and the zygote kills the worker: nothing outlives it.

Where no zygote can take it (no ``DPTEACH_ZYGOTE_SOCKET`` in the environment, the zygote gone, or an environment
that would import torch differently from the zygote's) this process simply becomes ``python -u ARGV...``.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys

from dpteach.ranks.zygote import GUEST_SOCKET, MAX_MESSAGE

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def forked_python() -> list[str]:
    """The command that torchrun's ``--no-python`` runs in place of ``python``: a worker forked from the zygote."""
    return [sys.executable, "-m", "dpteach.ranks.zygote_guest"]


def _fresh(argv: list[str], why: str) -> None:
    if os.environ.get("DPTEACH_GUEST_VERBOSE"):
        print(f"zygote_guest: a fresh interpreter ({why})", file=sys.stderr, flush=True)
    os.execv(sys.executable, [sys.executable, "-u", *argv])


def _ask(path: str, argv: list[str]) -> tuple[socket.socket, int] | str:
    """Have the zygote at ``path`` fork ``argv``: the connection and the child's pid, or why not."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        connection.connect(path)
        request = {"number": 1, "env": dict(os.environ), "cwd": os.getcwd(), "argv": argv}
        socket.send_fds(connection, [json.dumps(request).encode()], [1, 2])
        reply = connection.recv(MAX_MESSAGE).decode().split(maxsplit=2)
    except OSError as error:
        connection.close()
        return f"the zygote cannot be reached: {error}"
    if len(reply) < 3 or reply[0] != "started":
        connection.close()
        return reply[2] if len(reply) == 3 else "the zygote closed the connection"
    return connection, int(reply[2])


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] not in ("-m", "-c"):
        sys.exit("usage: python -m dpteach.ranks.zygote_guest (-m MODULE | -c CODE) [ARGS...]")
    path = os.environ.get(GUEST_SOCKET)
    asked = _ask(path, argv) if path else f"{GUEST_SOCKET} is not set"
    if isinstance(asked, str):
        _fresh(argv, asked)
    connection, pid = asked

    def forward(signum, _frame):
        try:
            os.killpg(pid, signum)  # the worker leads its own process group, as torchrun's workers do
        except ProcessLookupError:
            pass
    for signum in FORWARDED:
        signal.signal(signum, forward)
    while True:
        message = connection.recv(MAX_MESSAGE).decode().split()  # retried after a forwarded signal (PEP 475)
        if not message:  # the zygote is gone: so must the worker be
            forward(signal.SIGKILL, None)
            sys.exit(70)
        if message[0] == "exited" and int(message[1]) == pid:
            code = int(message[2])
            break
    if code < 0:  # end as the worker did: killed by the same signal
        if -code in FORWARDED:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
