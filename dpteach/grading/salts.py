"""Secret salts: chosen by the parent process, known inside each rank for that rank alone, and given to
the judge for every rank.

The data of a check with several ranks is drawn from a public seed (it is in the check module) mixed with
a rank's secret salt, so that no rank can rebuild another rank's data - or the expected answer - without
the messages that carry it. Where the salts come from decides whether that holds:

* **The parent makes them.** ``runner.py`` draws one key per rank per launch from ``os.urandom`` (taken
  when this module is imported: a solution cell that replaces ``random._urandom`` or ``os.urandom`` in a
  rank changes nothing here). A salt is ``HMAC(rank's key, "job/check/draw")``: the rank that owns the key
  can derive its own salts and no one else's.
* **A rank holds only its own key.** ``in_rank.py`` takes its key out of the plan before any learner code is
  loaded and drops the others'.
* **The judge never takes a salt, a seed or a gathered value from a rank's word.** It derives every rank's
  salts from the keys the parent gives it (``replay.py``), so a rank that fakes the grader's all-gather or
  records invented seeds only makes its own verdict disagree with the judge's.

:func:`mixed` is additive in the salt, so the judge turns one rank's mixed seed into every rank's
(:func:`peers`) without knowing the public seed the check used.
"""
from __future__ import annotations

import hashlib
import hmac
import os

SPAN = 2 ** 62
_urandom, _hmac_new, _sha256 = os.urandom, hmac.new, hashlib.sha256  # before any learner code: see above


def new_keys(world: int) -> list[str]:
    """One fresh key per rank (hex), for one launch."""
    return [_urandom(32).hex() for _ in range(world)]


def salt(key: str, job: int, check: int, draw: int) -> int:
    """The ``draw``-th salt of check ``check`` of job ``job`` for the rank holding ``key``: never 0."""
    digest = _hmac_new(bytes.fromhex(key), f"{job}/{check}/{draw}".encode(), _sha256).digest()
    return int.from_bytes(digest[:8], "big") % (SPAN - 1) + 1


def mixed(seed: int, salt_: int) -> int:
    """A rank's seed for one case: the public ``seed`` mixed with the rank's secret salt (0: unchanged)."""
    return (seed * 1_000_003 + salt_) % SPAN if salt_ else seed


def peers(mine: int, own: int, theirs: list[int]) -> list[int]:
    """Every rank's mixed seed from this rank's (``mine``, mixed with ``own``) and every rank's salt."""
    return [(mine - own + other) % SPAN for other in theirs]
