"""The parts of a training step that lesson 14 measures apart: each method's compute, and each message on each link.

A method's time to a target loss on a link is ``steps x compute per step`` plus ``the exchanges it made x what one
exchange costs on that link``. Timing every method's whole steps on every link and adding them up mixes the two,
and on a busy laptop it mixes in the machine's moods as well: a short run per link lands on whatever else the
machine was doing then, so the same local step came out at 23 ms on one link and 19 ms on another. Here each
part is measured once, in rounds (``dpteach/measure.py``: interleaved, the order rotated every round, a median
and an interval), and only their sum is arithmetic:

* **compute per step**, for every method: one more step of its own training run, with no emulated link, minus
  the time its compute stood still waiting for communication (``timeline.exposed_time``: DDP's wait for its
  bucket, a blocking exchange). What is left is forward, backward, the optimizer and the method's own extra
  work (PowerSGD's products and orthogonalisation, int8's encoding);
* **one message on each link**, for every message a method sent (its kind, size and dtype, as noted from its
  ``Comm`` while it trained): the real collective, held to the emulated link (``network/emulated.py``), so it
  costs what the link allows or what this machine's own copies took, whichever is longer;
* **a local step on each link**: a local SGD step that sends nothing, timed with each link in place - the
  check that the link changes nothing but the exchanges.

Every rank times every part; a part's sample in a round is the slowest rank's (a step ends when every rank
has finished it). A barrier before each timed part keeps one rank's lead out of the next part's time. The
rounds need no warm-up round of their own: they follow the methods' training run, which took every step and
sent every message already (only the local steps' trainers are new, and each takes one untimed step first).
"""
from __future__ import annotations

import time
from dataclasses import replace

import torch
import torch.distributed as dist

from ..measure import interleaved
from ..network.comm import Comm
from ..ranks import context
from ..replica.timeline import exposed_time

KINDS = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "all_to_all_single")
NO_SYNC = 10 ** 9  # local SGD averaging this rarely: a step that sends nothing


def message_key(kind: str, nbytes: int, dtype: torch.dtype) -> str:
    """``"all_reduce float32 4356136"``: one kind of message, ``nbytes`` counted as ``Comm.count`` takes them."""
    return f"{kind} {str(dtype).replace('torch.', '')} {nbytes}"


def parse_key(key: str) -> tuple[str, str, int]:
    kind, dtype, nbytes = key.split()
    return kind, dtype, int(nbytes)


class Listener:
    """Notes every collective a strategy's ``Comm`` runs (its public calls, wrapped on this one instance), so a
    run says what it sent step by step: ``log`` gains one key per message."""

    def __init__(self, comm: Comm):
        self.log: list[str] = []
        for name in KINDS:
            setattr(comm, name, self._wrap(comm, name, getattr(comm, name)))

    def _wrap(self, comm, name, call):
        def noted(*args, **kwargs):
            tensor = args[0] if name == "all_reduce" else args[1]
            kind = "all_gather" if name == "all_gather_into_tensor" else name
            nbytes = tensor.numel() * tensor.element_size() * (comm.world_size if kind == "all_gather" else 1)
            self.log.append(message_key(kind, nbytes, tensor.dtype))
            return call(*args, **kwargs)
        return noted


def replay(comm: Comm, key: str):
    """A function that sends message ``key`` once through ``comm`` (on its link) and returns the seconds it took."""
    kind, dtype, nbytes = parse_key(key)
    dtype = getattr(torch, dtype)
    size = torch.empty(0, dtype=dtype).element_size()
    device = context.device()
    if kind == "all_gather":
        part = torch.zeros(nbytes // comm.world_size // size, dtype=dtype, device=device)
        outputs = [torch.empty_like(part) for _ in range(comm.size)]
        send = lambda: comm.all_gather(outputs, part)  # noqa: E731
    elif kind in ("reduce_scatter", "all_to_all_single"):
        whole = torch.zeros(nbytes // size, dtype=dtype, device=device)
        out = torch.empty(whole.numel() // comm.size if kind == "reduce_scatter" else whole.numel(), dtype=dtype,
                          device=device)
        send = lambda: getattr(comm, kind)(out, whole)  # noqa: E731
    else:
        tensor = torch.zeros(nbytes // size, dtype=dtype, device=device)
        send = lambda: comm.all_reduce(tensor)  # noqa: E731

    def timed() -> float:
        start = time.perf_counter()
        send()
        context.synchronize()
        return time.perf_counter() - start
    return timed


def compute_of(trainer, steps):
    """A function that takes ``trainer``'s next step (numbered from ``steps``) and returns its compute: the step's
    time less the communication its compute waited for."""
    def timed() -> float:
        step = next(steps)
        before = len(trainer.timeline.spans)
        trainer.step(step)
        return trainer.step_times[-1] - exposed_time(trainer.timeline.spans[before:])
    return timed


def measure_parts(trainers: dict, keys: list, links: list, rounds: int, local_config, first_step: int) -> dict:
    """On every rank, in one schedule of rounds: each of ``trainers`` (name -> ``SyncTrainer``, no link) steps on
    from ``first_step`` for its compute; each message of ``keys`` is sent on each of ``links``; a local SGD step
    (``local_config`` with no averaging) runs with no link and with each link. Returns this rank's samples:
    ``{"compute": {name: [...]}, "exchange": {link: {key: [...]}}, "local_step": {"none" or link: [...]},
    "local_link_messages": {link: messages the link carried during local steps}}``."""
    from ..training.train import SyncTrainer
    items = {}
    for name, trainer in trainers.items():
        items["compute", name] = compute_of(trainer, iter(range(first_step, first_step + 10 ** 6)))
    comms = {link.name: Comm(link) for link in links}
    for link in links:
        for key in keys:
            items["exchange", link.name, key] = replay(comms[link.name], key)
    local = {"none": SyncTrainer(replace(local_config, knobs={"sync_every": NO_SYNC}, link=None))}
    for link in links:
        local[link.name] = SyncTrainer(replace(local_config, knobs={"sync_every": NO_SYNC}, link=link))
    for name, trainer in local.items():
        items["local_step", name] = compute_of(trainer, iter(range(10 ** 6)))
        items["local_step", name]()  # its warm-up; the methods' run just before warmed every other part
    samples = interleaved(items, rounds, warmup=0, before=dist.barrier, self_timed=True, samples=True)
    parts = {"compute": {}, "exchange": {link.name: {} for link in links}, "local_step": {}}
    for name, values in samples.items():
        if name[0] == "exchange":
            parts["exchange"][name[1]][name[2]] = values
        else:
            parts[name[0]][name[1]] = values
    parts["local_link_messages"] = {name: (trainer.strategy.comm.report() or {}).get("messages", 0)
                                    for name, trainer in local.items() if name != "none"}
    parts["link_reports"] = {name: comm.report() for name, comm in comms.items()}
    for trainer in local.values():
        trainer.strategy.close()
    return parts
