"""What an exercise's "try it" cell does when the learner's code is not working yet.

A rank that raises comes back as a ``RankError`` carrying the whole traceback from another process;
a deadlock comes back as a ``TimeoutError`` once the launch's timeout passes. While trying things
out, two lines say enough - which rank failed and the last line of its traceback - and the full
story is ``check()``'s job.
"""
from __future__ import annotations

from contextlib import contextmanager

from ..ranks.launcher import RankError


@contextmanager
def explain_failures():
    """Run the block; if a rank failed or the world timed out, print what went wrong in two lines."""
    try:
        yield
    except RankError as err:
        if err.rank_traceback:
            print(f"Not working yet: rank {err.rank} raised {err.exc_type}.")
            print(err.rank_traceback.strip().splitlines()[-1])
        else:  # the rank died without raising: a crash or a kill, which the message describes
            print(f"Not working yet: {err}")
    except TimeoutError as err:
        print("Not working yet:", err)
