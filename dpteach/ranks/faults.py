"""Faults on purpose: a rank that raises, is killed, hangs, or calls the wrong collective - and what its peers see.

A data-parallel step ends in a collective every rank must enter. So when one rank fails, the others
learn it only through that collective, and *how* they learn it depends on the failure::

    raise / kill   the process is gone, its sockets close: a gloo peer's next send or receive fails at
                   once ("Connection closed by peer"); torchrun's agent also sees the process exit
    hang           the process lives but never arrives: its peers wait inside the collective until the
                   process group's ``timeout`` - and torchrun, which watches processes, sees nothing wrong
    mismatch       the rank arrives at a different collective (another shape, another op): with
                   ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` torch checks every collective's fingerprint on a side
                   channel first and names both ranks' calls; without it the ranks may crash or hang

The hang is the expensive one: the timeout is the only thing that ends it, so it sets how long a stuck
job burns its machines (``init_process_group``'s default is 10 minutes for NCCL and 30 for gloo,
``torch/distributed/constants.py``; on NCCL a watchdog thread enforces it, ``ProcessGroupNCCL.cpp``).

``Fault("kill", rank=1, step=5)`` strikes on rank 1 just before step 5, on the first attempt only
(``TORCHELASTIC_RESTART_COUNT`` is 0), so a job that torchrun restarts runs on. Run as a module under
torchrun, this file is the small job of lesson 13's first experiment: W ranks all-reducing in a loop,
each writing what it saw, and when, to a folder::

    torchrun --standalone --nproc-per-node 2 -m dpteach.ranks.faults --kind hang --step 3 --out DIR
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

FAULT_KINDS = ("raise", "kill", "hang", "mismatch")


class InjectedFault(RuntimeError):
    """The exception a ``raise`` fault raises (its peers see a dead process, not this)."""


def restart_count() -> int:
    """How many times torchrun has restarted this job's workers (0 outside torchrun)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


@dataclass(frozen=True)
class Fault:
    """``kind`` strikes on ``rank`` just before ``step``; with ``first_attempt_only``, not after a restart."""

    kind: str
    rank: int = 1
    step: int = 1
    first_attempt_only: bool = True

    def check(self, world_size: int, steps: int | None = None) -> "Fault":
        from .. import validate
        validate.choice("fault kind", self.kind, FAULT_KINDS)
        validate.integer("fault rank", self.rank, low=0, high=world_size - 1)
        validate.integer("fault step", self.step, low=0, high=None if steps is None else steps - 1)
        return self

    @classmethod
    def parse(cls, text: str) -> "Fault":
        """``"kill@5:1"``: kind, then the step, then the rank (default 1)."""
        try:
            kind, rest = text.split("@")
            step, _, rank = rest.partition(":")
            return cls(kind.strip(), rank=int(rank or 1), step=int(step))
        except ValueError:
            raise ValueError(f"fault={text!r} is not allowed: write KIND@STEP[:RANK], e.g. kill@5:1, with KIND one "
                             f"of {', '.join(FAULT_KINDS)}") from None

    def due(self, step: int, rank: int) -> bool:
        return step == self.step and rank == self.rank and not (self.first_attempt_only and restart_count() > 0)

    def strike(self, log_dir=None, group=None) -> None:
        """Fail now, as ``kind`` says; first note the time (``log_dir``) so peers' delays can be measured.
        ``group``: the process group a ``mismatch`` calls its wrong collective on (default: the world's)."""
        import torch
        import torch.distributed as dist
        if log_dir is not None:
            write_json(Path(log_dir) / f"fault-rank{self.rank}.json",
                       {"rank": self.rank, "kind": self.kind, "step": self.step, "at": time.time()})
        sys.stdout.flush()
        sys.stderr.flush()
        if self.kind == "raise":
            raise InjectedFault(f"rank {self.rank} raised at step {self.step} (a fault injected on purpose)")
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.kind == "hang":
            while True:  # alive, never arriving: only a timeout (or a kill from outside) ends this
                time.sleep(60)
        if self.kind == "mismatch":  # a collective its peers are not running: another shape, another op
            dist.broadcast(torch.zeros(7), src=self.rank, group=group)


def write_json(path: Path, data: dict) -> None:
    """Written whole or not at all: a reader never sees half a file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return f"{type(exc).__name__}: {text.splitlines()[0][:300]}"


def all_reduce_loop(fault: Fault, steps: int, timeout_s: float, out: Path, numel: int = 1 << 16) -> int:
    """One rank of the fault demonstration: all-reduce ``steps`` times; record what happens.

    The ranks meet with the default timeout, then all-reduce in a group of their own whose timeout is
    ``timeout_s``: on a busy machine one rank may finish importing torch seconds after its peer, and that
    wait must not count as a hang (gloo's connection of the ranks waits up to the group's timeout)."""
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    group = dist.new_group(timeout=timedelta(seconds=timeout_s))
    dist.barrier()  # both ranks are here: the loop starts together
    rank = dist.get_rank()
    fault.check(dist.get_world_size(), steps)
    if rank != fault.rank:
        # torchrun stops every worker with SIGTERM once one has died. On a busy machine that can reach a peer
        # before it has run the few lines that write down what it saw, and the record is what the lesson reads.
        # A peer ends on its own either way (at its error, or at the group's timeout): it writes, then exits.
        signal.signal(signal.SIGTERM, lambda *_: None)
    x = torch.ones(numel)
    try:
        for step in range(steps):
            if fault.due(step, rank):
                fault.strike(out, group)
            dist.all_reduce(x, group=group)
            time.sleep(0.02)  # a step's compute
    except InjectedFault:
        raise
    except Exception as exc:  # noqa: BLE001 - what the peer saw is the lesson
        write_json(out / f"seen-rank{rank}.json", {"rank": rank, "at": time.time(), "error": first_line(exc)})
        sys.stdout.flush()
        os._exit(1)  # as a failed rank should: at once, not waiting in an exit barrier
    write_json(out / f"seen-rank{rank}.json", {"rank": rank, "at": time.time(), "error": None})
    dist.destroy_process_group()
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="W ranks all-reducing in a loop; one of them fails on purpose")
    parser.add_argument("--kind", choices=FAULT_KINDS, required=True)
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--step", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=3.0, help="the process group's timeout, seconds")
    parser.add_argument("--out", required=True, help="folder for each rank's record")
    args = parser.parse_args(argv)
    return all_reduce_loop(Fault(args.kind, rank=args.rank, step=args.step), args.steps, args.timeout,
                           Path(args.out))


if __name__ == "__main__":
    sys.exit(main())
