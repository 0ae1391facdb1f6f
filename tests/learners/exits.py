"""Solutions to exercise 02 that end their own process in the middle of the ring, on rank 1 only.

Each is the correct ring of ``styles.py`` with one statement put in front of its first message."""
from .styles import solution as ring_solution

EXITS = {  # name -> (the statement, what the report must say)
    "os._exit(0)": ("os._exit(0)", "rank 1 ended its own process with exit code 0"),
    "os._exit(3)": ("os._exit(3)", "rank 1 ended its own process with exit code 3"),
    "SIGKILL": ("os.kill(os.getpid(), signal.SIGKILL)", "rank 1 was killed by SIGKILL"),
    # ctypes is tampering now (tampering.py), so the crash is the signal a native crash sends
    "native crash": ("os.kill(os.getpid(), signal.SIGSEGV)", "rank 1 was killed by SIGSEGV (a crash in native code"),
}

FIRST_LINE = "    world, rank = dist.get_world_size(), dist.get_rank()\n"


def solution(name: str) -> str:
    ring = ring_solution("02", "exchange")
    assert ring.count(FIRST_LINE) == 1
    ends = f"{FIRST_LINE}    if world > 1 and rank == 1:\n        {EXITS[name][0]}\n"
    return "import os\nimport signal\n" + ring.replace(FIRST_LINE, ends)
