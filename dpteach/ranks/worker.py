"""Entry point of one rank started by :func:`dpteach.launch`: ``main()`` is what every rank runs.

A CPU rank is a child forked from the launcher's zygote (``zygote.py``: a process that has imported
torch and nothing else); a GPU rank is a fresh interpreter (``python -m dpteach.ranks.worker``).
Either way it is never a ``multiprocessing`` child of the caller: a function defined in a notebook
cell or in a script without a ``__main__`` guard is never re-executed, and the rank can be killed
together with everything it started (it leads its own process group).

The rank joins the world through the key-value store that the launcher holds, runs the function,
and writes what happened (return value or traceback) to its result file atomically.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from datetime import timedelta


def _exit_when_orphaned(parent_pid: int) -> None:
    """If the launching process dies without cleaning up, do not linger as an orphan."""
    while True:
        if os.getppid() != parent_pid:
            os._exit(70)
        time.sleep(0.5)


def _write_atomically(path: str, payload: bytes) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main() -> int:
    env = os.environ
    threading.Thread(target=_exit_when_orphaned, args=(int(env["DPTEACH_PARENT_PID"]),),
                     daemon=True).start()
    for entry in reversed(json.loads(env.get("DPTEACH_SYS_PATH", "[]"))):
        if entry not in sys.path:
            sys.path.insert(0, entry)

    import cloudpickle
    import torch
    import torch.distributed as dist

    from dpteach.ranks.backend import open_nccl_communicator, use_device

    rank, world_size = int(env["RANK"]), int(env["WORLD_SIZE"])
    result_path = env["DPTEACH_RESULT"]
    threads = env.get("DPTEACH_THREADS")
    if threads:
        torch.set_num_threads(int(threads))
    cores = env.get("DPTEACH_CORES")
    if cores:  # every thread so far (the mask is per thread); gloo's, started later, inherit it
        for thread in os.listdir("/proc/self/task"):
            os.sched_setaffinity(int(thread), {int(c) for c in cores.split(",")})
    joining = False  # True only while this rank connects to its peers: a failure then is not fn's fault
    try:
        with open(env["DPTEACH_PAYLOAD"], "rb") as f:
            fn, args, kwargs = cloudpickle.load(f)
        device = env["DPTEACH_DEVICE"]
        joining = True
        use_device(device)
        timeout = timedelta(seconds=float(env["DPTEACH_TIMEOUT"]))
        store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False,
                              timeout=timeout)
        dist.init_process_group(env["DPTEACH_BACKEND"], store=dist.PrefixStore("pg", store),
                                rank=rank, world_size=world_size, timeout=timeout)
        open_nccl_communicator(device)
        store.add("launch/joined", 1)  # the launcher's "starting N ranks" bar counts these
        joining = False
        value = fn(*args, **kwargs)
        dist.destroy_process_group()  # only on success: after an error, peers may never arrive
        outcome = {"ok": True, "value": value}
    except BaseException as exc:  # report everything, SystemExit and KeyboardInterrupt included
        outcome = {"ok": False, "type": type(exc).__name__, "message": str(exc),
                   "traceback": traceback.format_exc(), "failed_at": time.time(), "while_joining": joining}
        try:
            cloudpickle.dumps(exc)
            outcome["exception"] = exc
        except Exception:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        payload = cloudpickle.dumps(outcome)
    except Exception as exc:
        outcome = {"ok": False, "type": "TypeError",
                   "message": f"rank {rank}'s return value cannot be sent back: {exc}",
                   "traceback": traceback.format_exc()}
        payload = cloudpickle.dumps(outcome)
    _write_atomically(result_path, payload)
    return 0 if outcome["ok"] else 1


if __name__ == "__main__":
    code = main()
    # The result is on disk and the output flushed: leave now. Python's own shutdown would next run
    # torch's C++ destructors (process groups still referenced by DDP, gloo's threads), which on
    # rare runs abort ("terminate called without an active exception") after a perfect result.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
