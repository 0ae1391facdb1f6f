"""How the course compares measured times: interleaved, repeated, a median with an interval, and a
ranking only where the intervals separate.

A lesson runs on a laptop that is also running a browser, a file indexer and whatever else. Time A
for a second, then B for a second, and the comparison measures the machine's moods as much as A and B:
the course once printed a table in which the same local step took 23 ms on one link and 19 ms on
another, and the "winner" changed from link to link. Three rules keep a comparison honest:

1. **Interleave.** Time the candidates in rounds, A, B, C, then B, C, A, then C, A, B, ..., so that a
   slow stretch of the machine falls on every candidate alike, and no candidate always goes first
   (first after a pause often runs on a cold cache).
2. **Repeat, and keep the spread.** Report the median of the rounds (one stray slow round does not move
   it) and an interval for that median. The interval here assumes nothing about how the times are
   distributed: with ``n`` samples sorted, ``[x_(j), x_(n+1-j)]`` holds the true median unless at least
   ``n+1-j`` of the samples fell on one side of it, which for independent samples has probability
   ``2 * P(Binomial(n, 1/2) <= j-1)`` (the order-statistic interval for a median; Conover,
   *Practical Nonparametric Statistics*, 3rd ed., section 3.2). With five rounds that interval is the
   smallest to the largest sample, and covers the median with probability 1 - 2/32 = 94%.
3. **Rank only when separated.** A is faster than B only if A's whole interval lies below B's. When
   they overlap, the honest sentence is "within this machine's noise", with how far apart the medians
   were - not a winner.

Rounds taken back to back are not perfectly independent on a busy machine, so read the interval as
"what this machine does from round to round", not as a textbook 94%.

    spreads = interleaved({"ring": run_ring, "tree": run_tree}, rounds=7)
    spreads["ring"].median, spreads["ring"].low, spreads["ring"].high
    ranking(spreads).sentence("s")   # "ring is fastest: ..." or "ring and tree are within noise: ..."

Experiments whose ranks time steps themselves hand their per-round samples to :func:`spread`; the
rest of this module only needs the numbers.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

CONFIDENCE = 0.9  # the least coverage asked of an interval; with 5 samples it is min..max (94%)
FEWEST_ROUNDS = 5  # below this no interval of the median reaches CONFIDENCE (4 samples: 88%)


def _binomial_tail(n: int, k: int) -> float:
    """P(Binomial(n, 1/2) <= k)."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n


def median_interval_ranks(n: int, confidence: float = CONFIDENCE) -> tuple[int, int]:
    """The 0-based positions (lo, hi) in ``n`` sorted samples of the narrowest order-statistic interval for
    the median whose coverage is at least ``confidence`` (the whole range when none reaches it)."""
    j = 1
    while j + 1 <= (n + 1) // 2 and 1 - 2 * _binomial_tail(n, j) >= confidence:
        j += 1  # [x_(j+1), x_(n-j)] still covers enough
    return j - 1, n - j


@dataclass(frozen=True)
class Spread:
    """Repeated measurements of one quantity: their median and an interval for it."""

    samples: tuple
    median: float
    low: float
    high: float
    coverage: float  # the probability that [low, high] holds the median, for independent samples

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def below(self, other: "Spread") -> bool:
        """True when this whole interval lies under the other's: this one is smaller, beyond the noise."""
        return self.high < other.low

    def separated(self, other: "Spread") -> bool:
        return self.below(other) or other.below(self)

    def scaled(self, factor: float) -> "Spread":
        """The same measurement in another unit (seconds to milliseconds: ``scaled(1e3)``)."""
        return Spread(tuple(s * factor for s in self.samples), self.median * factor, self.low * factor,
                      self.high * factor, self.coverage)

    def text(self, unit: str = "", digits: int = 1) -> str:
        """``12.3 ms (11.9-13.0)``: the median, then the interval."""
        u = f" {unit}" if unit else ""
        return f"{self.median:.{digits}f}{u} ({self.low:.{digits}f}-{self.high:.{digits}f})"

    def as_dict(self) -> dict:
        return {"median": self.median, "low": self.low, "high": self.high, "n": self.n,
                "coverage": self.coverage, "samples": list(self.samples)}


def spread(samples, confidence: float = CONFIDENCE) -> Spread:
    """The median of ``samples`` and the order-statistic interval around it (module docstring)."""
    values = sorted(float(s) for s in samples)
    if not values:
        raise ValueError("samples=[] is not allowed: a spread needs at least one measurement")
    lo, hi = median_interval_ranks(len(values), confidence)
    j = lo + 1
    coverage = 1 - 2 * _binomial_tail(len(values), j - 1)
    return Spread(tuple(values), statistics.median(values), values[lo], values[hi], coverage)


def turned(items: list, round_: int) -> list:
    """``items`` in the order of round ``round_``: turned by one place each round (A B C, then B C A, then C A B),
    so that no candidate always goes first or always follows the same one."""
    shift = round_ % len(items)
    return list(items[shift:]) + list(items[:shift])


def interleaved(calls: dict, rounds: int = FEWEST_ROUNDS, warmup: int = 1, clock=time.perf_counter,
                before=None, self_timed: bool = False, samples: bool = False) -> dict:
    """Time each of ``calls`` (name -> function of no arguments) ``rounds`` times, interleaved and with the
    order rotated every round; ``warmup`` untimed rounds first. Returns name -> :class:`Spread` of seconds
    (with ``samples``: name -> the list of seconds, in round order).

    ``before()`` runs untimed before each call (inside ranks: ``dist.barrier``, so every rank starts the part
    together). ``self_timed``: each call returns its own seconds (a part of a step it measured itself) instead
    of being timed whole. Inside ranks, give every rank the same ``calls`` in the same order, and make each call
    end in whatever synchronises the ranks (a collective does): then the rounds line up across ranks."""
    if not calls:
        raise ValueError("calls={} is not allowed: give at least one function to time")
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds={rounds!r} is not allowed: it must be an integer >= 1")
    names = list(calls)
    times: dict = {name: [] for name in names}
    for r in range(warmup + rounds):
        for name in turned(names, r):
            if before is not None:
                before()
            start = clock()
            seconds = calls[name]()
            if not self_timed:
                seconds = clock() - start
            if r >= warmup:
                times[name].append(seconds)
    return times if samples else {name: spread(times[name]) for name in names}


@dataclass
class Ranking:
    """Candidates ordered by median, with the leaders the measurement cannot tell apart."""

    order: list  # names, smallest median first
    spreads: dict
    leaders: list = field(default_factory=list)  # the first, and every other whose interval meets the first's

    @property
    def winner(self):
        """The one name that beats every other beyond the noise, or None when the leaders are several."""
        return self.order[0] if len(self.leaders) == 1 else None

    def as_dict(self, unit: str = "s", scale: float = 1.0, digits: int = 2, lower: str = "faster") -> dict:
        """What a result carries of a ranking: ``{"order", "leaders", "winner", "sentence"}`` (plain data)."""
        return {"order": self.order, "leaders": self.leaders, "winner": self.winner,
                "sentence": self.sentence(unit, scale, digits, lower)}

    def sentence(self, unit: str = "s", scale: float = 1.0, digits: int = 2, lower: str = "faster") -> str:
        """One sentence a lesson can print: the winner and its margin, or the leaders within noise."""
        show = {name: self.spreads[name].scaled(scale) for name in self.order}
        first = self.order[0]
        if len(self.order) == 1:
            return f"`{first}`: {show[first].text(unit, digits)}."
        if self.winner is not None:
            second = self.order[1]
            return (f"`{first}` is {lower} than every other beyond this machine's noise: {show[first].text(unit, digits)} "
                    f"against the next, `{second}`, at {show[second].text(unit, digits)} (median and interval of "
                    f"{show[first].n} interleaved rounds).")
        quoted = [f"`{n}`" for n in self.leaders]
        names = quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]
        top = max(self.spreads[n].median for n in self.leaders)
        gap = (top / self.spreads[first].median - 1) * 100 if self.spreads[first].median > 0 else 0.0
        rest = [f"`{n}`" for n in self.order if n not in self.leaders]
        behind = f" Behind them beyond the noise: {', '.join(rest)}." if rest else ""
        return (f"{names} are within this machine's noise of each other: their medians differ by {gap:.0f}% "
                f"and their intervals overlap ({'; '.join(f'`{n}` ' + show[n].text(unit, digits) for n in self.leaders)})."
                + behind)


def ranking(spreads: dict) -> Ranking:
    """Order ``spreads`` (name -> Spread) by median; the leaders are the first and every candidate whose
    interval is not wholly above the first's."""
    if not spreads:
        raise ValueError("spreads={} is not allowed: rank at least one measurement")
    order = sorted(spreads, key=lambda name: spreads[name].median)
    best = spreads[order[0]]
    leaders = [order[0]] + [name for name in order[1:] if not best.below(spreads[name])]
    return Ranking(order, dict(spreads), leaders)
