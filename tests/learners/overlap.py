"""Exercise 04 solutions the reference answer never showed the grader.

Correct ones in every way of launching, waiting and averaging the exercise allows: work handles, futures
(waited on, chained with ``.then()``, collected), polling, ``ReduceOp.AVG`` - each must score full marks
every time, whatever the timing (gloo marks a work's future done a moment before the work reports itself
completed, so a grader that reads ``work.is_completed()`` after a future's ``wait()`` misjudges them).

Wrong ones: a hook that launches each bucket as soon as it is complete, out of bucket order (right on a
model whose buckets complete in order, wrong as soon as ranks see them complete in different orders); a
``finish()`` that never waits; and a division by ``get_rank() + 1`` for ``get_world_size()``, which is
right on one rank of two and wrong on the other - so one rank fails the check while its peer waits for it
in the next step's all-reduce.
"""

TEMPLATE = '''\
import time

import torch
import torch.distributed as dist


class OverlapSync:
    def __init__(self, model, buckets):
        self.buckets = buckets
        self.buffers, self.where = [], {}
        for b, params in enumerate(buckets):
            flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype)
            offset = 0
            for p in params:
                self.where[p] = (b, flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
            self.buffers.append(flat)
        for p in self.where:
            p.register_post_accumulate_grad_hook(self.hook)
        self.reset()

    def reset(self):
        self.missing = [len(params) for params in self.buckets]
        self.next_bucket = 0
        self.handles = []
        self.fired = set()

    def hook(self, param):
        b, view = self.where[param]
        view.copy_(param.grad)
        self.fired.add(param)
        self.missing[b] -= 1
        self.launch_ready(b)

    def launch_ready(self, completed=None):
        while self.next_bucket < len(self.buckets) and self.missing[self.next_bucket] == 0:
            buffer = self.buffers[self.next_bucket]
            self.handles.append(LAUNCH)
            self.next_bucket += 1

    def finish(self):
        for p, (b, view) in self.where.items():
            if p not in self.fired:
                view.zero_()
                self.missing[b] -= 1
        self.launch_ready()
        WAIT
        world = dist.get_world_size()
        for p, (b, view) in self.where.items():
            averaged = AVERAGED
            if p.grad is None:
                p.grad = averaged.clone()
            else:
                p.grad.copy_(averaged)
        self.reset()
'''

WORK = "dist.all_reduce(buffer, async_op=True)"
FUTURE = "dist.all_reduce(buffer, async_op=True).get_future()"
EACH = "for handle in self.handles:\n            handle.wait()"

# name -> (how a bucket is launched, how finish() waits, the averaged gradient of a parameter)
STYLES = {
    "work.wait()": (WORK, EACH, "view / world"),
    "get_future().wait()": (FUTURE, EACH, "view / world"),
    "then(divide in place), wait()": (
        FUTURE + ".then(lambda fut: fut.value()[0].div_(dist.get_world_size()))", EACH, "view"),
    "then(callback that waits), wait_all": (
        FUTURE + ".then(lambda fut: fut.wait()[0].div_(dist.get_world_size()))",
        "torch.futures.wait_all(self.handles)", "view"),
    "collect_all().wait()": (FUTURE, "torch.futures.collect_all(self.handles).wait()", "view / world"),
    "ReduceOp.AVG": ("dist.all_reduce(buffer, op=dist.ReduceOp.AVG, async_op=True)", EACH, "view"),
    "is_completed() polling": (
        WORK, "while not all(handle.is_completed() for handle in self.handles):\n            time.sleep(0.0005)",
        "view / world"),
}


def solution(launch: str, wait: str, averaged: str) -> str:
    text = TEMPLATE
    for marker, value in (("LAUNCH", launch), ("WAIT", wait), ("AVERAGED", averaged)):
        assert text.count(marker) == 1, marker
        text = text.replace(marker, value)
    return text


def style(name: str) -> str:
    return solution(*STYLES[name])


CORRECT = style("work.wait()")

# Launches a bucket the moment it is complete, whatever the buckets before it: the mistake the hints warn of.
EAGER = CORRECT.replace("""        self.launch_ready(b)
""", """        if self.missing[b] == 0:
            self.handles.append(dist.all_reduce(self.buffers[b], async_op=True))
            self.next_bucket += 1
""").replace("""        self.launch_ready()
        for handle""", """        for handle""")

# Launches in order, from the hook, and never waits: finish() reads whatever the buffers hold by then.
NO_WAIT = solution(WORK, "pass", "view / world")

# get_rank() + 1 where the world size was meant: right on the last rank of two, the sum on rank 0.
RANK_FOR_WORLD = CORRECT.replace("world = dist.get_world_size()", "world = dist.get_rank() + 1")

for _name, _text in {"EAGER": EAGER, "NO_WAIT": NO_WAIT, "RANK_FOR_WORLD": RANK_FOR_WORLD}.items():
    assert _text != CORRECT, f"{_name} did not change the correct solution: TEMPLATE was edited?"
