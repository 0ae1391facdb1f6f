"""Is there memory for W more ranks? Asked before any rank starts.

A rank started as a fresh Python process imports torch and builds its own replica: measured on the
course's models, it holds about 230-250 MiB of memory of its own (``RANK_MIB``), whatever the model.
A CPU rank forked from the zygote (``zygote.py``) shares torch's pages with it and holds far less of
its own (measured, a small MLP trained one step: 12 MiB private against 212 MiB for a fresh process),
while the zygote holds about 300 MiB once. The check keeps the fresh-process figure, an upper bound for
both: four ranks need at most about 1 GiB beyond what the notebook's kernel already uses.

On a laptop that is nothing; in a container it can be everything. Binder gives a session 1 to 2 GB,
and when a container goes over its limit the kernel's out-of-memory killer picks the largest
process - usually the notebook's own kernel, not a rank. The learner then sees "kernel died"
instead of an error. So ``launch`` asks first: how much memory may this container still use?

The answer comes from the memory cgroup (v2 ``memory.max`` and ``memory.current``, or v1
``memory.limit_in_bytes`` and ``memory.usage_in_bytes``) minus the page cache the kernel can drop
(``inactive_file``), and from ``/proc/meminfo``'s ``MemAvailable`` for the machine as a whole;
the smaller wins. Set ``DPTEACH_SKIP_MEMORY_CHECK=1`` to start the ranks anyway.
"""
from __future__ import annotations

import os
from pathlib import Path

RANK_MIB = 256  # a rank's own memory (torch imported, a lesson's model trained), rounded up
MIB = 1 << 20


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().split()[0]
    except (OSError, IndexError):
        return None
    return None if text == "max" else int(text)


def _stat(path: Path) -> dict[str, int]:
    try:
        return {k: int(v) for k, v in (line.split() for line in path.read_text().splitlines())}
    except (OSError, ValueError):
        return {}


def _cgroup_dir(proc: Path, cgroup_root: Path) -> tuple[Path, int] | None:
    """The directory of this process's memory cgroup and its version (2 or 1), or None."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        version = 2 if controllers == "" else 1 if "memory" in controllers.split(",") else 0
        if not version:
            continue
        mount = cgroup_root if version == 2 else cgroup_root / "memory"
        limit_file = "memory.max" if version == 2 else "memory.limit_in_bytes"
        # Inside a container the cgroup is usually the mount's root, whatever the path says.
        for candidate in (mount / path.lstrip("/"), mount):
            if (candidate / limit_file).exists():
                return candidate, version
    return None


def free_memory(proc: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> dict:
    """How many bytes this process and its children may still use, and why.

    Returns ``{"free": bytes, "limit": bytes or None, "source": "cgroup" or "machine"}``.
    """
    proc_path, root = Path(proc), Path(cgroup_root)
    meminfo = {}
    try:
        for line in (proc_path / "meminfo").read_text().splitlines():
            key, value = line.split(":", 1)
            meminfo[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    result = {"free": meminfo.get("MemAvailable"), "limit": meminfo.get("MemTotal"), "source": "machine"}
    found = _cgroup_dir(proc_path, root)
    if found:
        directory, version = found
        if version == 2:
            limit, used = _read_int(directory / "memory.max"), _read_int(directory / "memory.current")
            cache = _stat(directory / "memory.stat").get("inactive_file", 0)
        else:
            limit, used = _read_int(directory / "memory.limit_in_bytes"), _read_int(directory / "memory.usage_in_bytes")
            cache = _stat(directory / "memory.stat").get("total_inactive_file", 0)
        if limit is not None and used is not None and limit < (1 << 60):  # v1 writes "no limit" as ~2**63
            free = max(0, limit - max(0, used - cache))
            if result["free"] is None or free < result["free"]:
                result = {"free": free, "limit": limit, "source": "cgroup"}
    return result


def check_memory_for_ranks(world_size: int, **where) -> None:
    """Raise ``ValueError`` before starting ``world_size`` ranks that would not fit in memory."""
    if os.environ.get("DPTEACH_SKIP_MEMORY_CHECK"):
        return
    memory = free_memory(**where)
    if memory["free"] is None:
        return  # not Linux, or nothing readable: nothing to say
    needed = world_size * RANK_MIB * MIB
    if needed <= memory["free"]:
        return
    fits = memory["free"] // (RANK_MIB * MIB)
    where_text = "this container" if memory["source"] == "cgroup" else "this machine"
    limit = f" of its {memory['limit'] / MIB:.0f} MiB" if memory["limit"] else ""
    advice = f"use world_size <= {fits}" if fits >= 1 else "free some memory (close other notebooks' kernels)"
    raise ValueError(
        f"world_size={world_size} is not allowed here: {world_size} ranks need about {needed // MIB} MiB "
        f"({RANK_MIB} MiB each: every rank imports torch and builds its own replica), and {where_text} has "
        f"{memory['free'] / MIB:.0f} MiB free{limit}; {advice}, or set DPTEACH_SKIP_MEMORY_CHECK=1 to try anyway")
