"""One replica group of a job that survives a failure without a restart, with torchft (github.com/pytorch/torchft).

torchrun's answer to a failed rank is to stop every worker and start them all again from a checkpoint
(``resumable.py``). torchft splits the job into *replica groups* instead - each a whole copy of the model,
sharded inside as it likes - and runs data parallelism *between* them, one step at a time::

    every step, in every group:
        manager.start_quorum()      ask the Lighthouse (one small server for the job) who is alive now
        forward, backward           DDP's hooks all-reduce the gradients over the groups in the quorum
        optimizer.step()            only if manager.should_commit(): a vote among this group's own ranks

``should_commit`` agrees *within* one replica group - True when no rank of the group hit an error - and
"different replica groups may return different values" (its docstring in ``torchft/manager.py``; the vote
is counted by the group's own ``ManagerServer``, ``src/manager.rs``). Groups rarely disagree in practice:
when a group dies in the middle of the all-reduce, every survivor's all-reduce fails as well, each records
the error, and each group votes not to step.

A group that dies drops out of the next quorum; the others go on, averaging over fewer groups (a smaller
global batch for a while) instead of stopping. A group that (re)joins is behind: the manager sees it in
the quorum and has a healthy peer send it the weights and the optimizer state over the process group
(``PGTransport``, "live recovery"), so it joins at the job's current step, not at a checkpoint's.
Sources: torchft's ``README.md`` and ``torchft/manager.py`` (``start_quorum``, ``should_commit``,
``_async_quorum``), ``torchft/ddp.py`` and ``torchft/optim.py``.

Here each group is one process with one CPU rank, and a group's own torchrun store is this process's
TCP store. Run as a module, it is one replica group of lesson 13's ``replica_groups``::

    python -m dpteach.training.fault_tolerant --group 0 --lighthouse URL --out group0.json
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path


def train_group(group: int, lighthouse: str, steps: int, out: Path, die_after: int | None, seed: int,
                timeout_s: float, step_ms: float) -> None:
    import torch
    import torch.distributed as dist
    from torchft import DistributedDataParallel, Manager, ProcessGroupGloo
    from torchft.checkpointing.pg_transport import PGTransport

    from ..ranks.faults import write_json
    from ..replica.data import loss_fn, make_dataset, sample_batch
    from ..replica.models import build_model

    model = build_model("mlp", seed=seed, device=torch.device("cpu"))
    inner = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    dataset, criterion = make_dataset("mlp", 4096, seed=seed), loss_fn("mlp")
    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)  # what torchrun would host
    pg = ProcessGroupGloo(timeout=timedelta(seconds=timeout_s))
    manager = Manager(
        pg=pg, min_replica_size=1, replica_id=f"group{group}", store_addr="localhost", store_port=store.port,
        rank=0, world_size=1, lighthouse_addr=lighthouse, timeout=timedelta(seconds=timeout_s),
        state_dict=lambda: {"model": model.state_dict(), "optim": inner.state_dict()},
        load_state_dict=lambda state: (model.load_state_dict(state["model"]), inner.load_state_dict(state["optim"])),
        checkpoint_transport=PGTransport(pg, timeout=timedelta(seconds=timeout_s), device=torch.device("cpu")))
    ddp = DistributedDataParallel(manager, model)  # its gradient hook all-reduces through the manager
    log, started = [], time.time()
    while manager.current_step() < steps:
        manager.start_quorum()  # who is in this step; a group that is behind is sent the state here
        step = manager.current_step()
        # The batch of a step is the same whichever process trains it: a replacement draws what the dead one would.
        order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed * 100_003 + step))
        x, y = sample_batch(dataset, order[group * 32:(group + 1) * 32].tolist())
        inner.zero_grad()
        time.sleep(step_ms / 1e3)  # a step as long as a real model's: the lighthouse decides on a 100 ms tick
        criterion(ddp(x), y).backward()
        committed = manager.should_commit()  # this group's vote: False if any of its ranks saw an error
        if committed:
            inner.step()
        log.append({"step": step, "committed": committed, "participants": manager.num_participants(),
                    "at": time.time()})
        if die_after is not None and manager.current_step() >= die_after:
            write_json(out, {"group": group, "log": log, "started": started, "killed_at": time.time()})
            os.kill(os.getpid(), signal.SIGKILL)  # no clean-up, no goodbye to the lighthouse
    params = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    torch.save(params, out.with_suffix(".pt"))
    write_json(out, {"group": group, "log": log, "started": started, "ended": time.time()})
    manager.shutdown(wait=False)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="one torchft replica group of one CPU rank")
    parser.add_argument("--group", type=int, required=True)
    parser.add_argument("--lighthouse", required=True, help="the lighthouse's address")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", required=True, help="where to write this group's record (JSON)")
    parser.add_argument("--die-after", type=int, default=None, help="SIGKILL itself once this step is committed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--step-ms", type=float, default=100.0, help="the least time a step takes")
    args = parser.parse_args(argv)
    train_group(args.group, args.lighthouse, args.steps, Path(args.out), args.die_after, args.seed, args.timeout,
                args.step_ms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
