"""``naive``: after backward, one blocking all-reduce per parameter.

The simplest correct data parallelism, and the slowest: every parameter pays the all-reduce's
fixed latency separately (a model with 12 tensors pays it 12 times), and nothing is sent until
backward has finished, so the whole exchange is exposed - the GPUs of the practice question sit
idle exactly here.
"""
from .base import GradientSync


class NaiveSync(GradientSync):
    name = "naive"
    takes_all_reduce = ("ring", "tree")

    def finish(self, step: int) -> None:
        for index, p in enumerate(self.params):
            with self.comm.exchange(param=index):
                self.all_reduce_mean(p.grad)
