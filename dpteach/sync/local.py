"""``local``: no communication at all - the compute floor every other strategy is measured against.

Each rank trains on its own shard and never talks to the others, so the replicas drift apart; it
is not data-parallel training. It exists to measure, in the same run, how long a step takes with
zero communication: a strategy's *exposed* communication is its step time minus this one.
"""
from .base import GradientSync


class LocalOnly(GradientSync):
    name = "local"
    exact = False
    communicates = False

    def finish(self, step: int) -> None:
        pass
