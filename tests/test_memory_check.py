"""launch() refuses a world that would not fit in the container's memory, before any rank starts.

The parsing is tested on cgroup files written here (v1 and v2 layouts); the whole path is tested on
a real memory cgroup where the test runs as root on a machine that has one.
"""
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from dpteach.ranks.memory import MIB, RANK_MIB, check_memory_for_ranks, free_memory


def _fake(tmp_path, cgroup_line, files, meminfo_mib=16384):
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(cgroup_line + "\n")
    (proc / "meminfo").write_text(f"MemTotal: {meminfo_mib * 2 * 1024} kB\nMemAvailable: {meminfo_mib * 1024} kB\n")
    for name, text in files.items():
        path = tmp_path / "cg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return {"proc": str(proc), "cgroup_root": str(tmp_path / "cg")}


def test_cgroup_v2_limit_minus_usage_plus_droppable_cache(tmp_path):
    where = _fake(tmp_path, "0::/user/session", {
        "user/session/memory.max": str(2048 * MIB), "user/session/memory.current": str(1500 * MIB),
        "user/session/memory.stat": f"anon {1000 * MIB}\ninactive_file {300 * MIB}\n"})
    assert free_memory(**where) == {"free": (2048 - 1200) * MIB, "limit": 2048 * MIB, "source": "cgroup"}


def test_cgroup_v1_in_a_container_reads_the_mount_root(tmp_path):
    # The path names the host's cgroup, but inside the container the cgroup is mounted at the root.
    where = _fake(tmp_path, "4:memory:/docker/abc123", {
        "memory/memory.limit_in_bytes": str(1024 * MIB), "memory/memory.usage_in_bytes": str(900 * MIB),
        "memory/memory.stat": f"total_inactive_file {100 * MIB}\n"})
    assert free_memory(**where)["free"] == 224 * MIB
    with pytest.raises(ValueError, match=r"world_size=2 is not allowed here: 2 ranks need about 512 MiB .* "
                                         r"this container has 224 MiB free of its 1024 MiB; free some memory"):
        check_memory_for_ranks(2, **where)


def test_no_cgroup_limit_falls_back_to_the_machine(tmp_path):
    where = _fake(tmp_path, "0::/", {"memory.max": "max", "memory.current": str(10 * MIB)}, meminfo_mib=600)
    memory = free_memory(**where)
    assert memory["source"] == "machine" and memory["free"] == 600 * MIB
    check_memory_for_ranks(2, **where)  # 512 MiB fits in 600
    with pytest.raises(ValueError, match=r"this machine has 600 MiB free.*use world_size <= 2"):
        check_memory_for_ranks(3, **where)


def test_the_check_can_be_skipped(tmp_path, monkeypatch):
    where = _fake(tmp_path, "0::/", {}, meminfo_mib=100)
    with pytest.raises(ValueError):
        check_memory_for_ranks(4, **where)
    monkeypatch.setenv("DPTEACH_SKIP_MEMORY_CHECK", "1")
    check_memory_for_ranks(4, **where)


V1 = Path("/sys/fs/cgroup/memory")


@pytest.fixture
def small_cgroup():
    """A real cgroup-v1 memory group capped at 900 MiB, or a skip saying why there is none."""
    if os.geteuid() != 0 or not V1.is_dir():
        pytest.skip("needs root and a cgroup-v1 memory controller")
    group = V1 / f"dpteach-test-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(900 * MIB))
    except OSError as exc:
        if group.is_dir():
            group.rmdir()
        pytest.skip(f"cannot make a memory cgroup here: {exc}")
    yield group
    for _ in range(50):  # the group can be removed once its last process is gone
        try:
            group.rmdir()
            return
        except OSError:
            time.sleep(0.1)


def test_in_a_real_small_container_launch_refuses_before_starting_ranks(tmp_path, small_cgroup):
    script = tmp_path / "small.py"
    script.write_text(textwrap.dedent("""
        import dpteach, torch.distributed as dist
        def rank():
            return dist.get_rank()
        print("one rank:", dpteach.launch(rank, 1), flush=True)
        try:
            dpteach.launch(rank, 4)
        except ValueError as exc:  # a rank killed for memory would come back as RankError instead
            print("refused:", exc, flush=True)
    """))
    code = f"echo $$ > {small_cgroup}/cgroup.procs && exec {sys.executable} {script}"
    out = subprocess.run(["sh", "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "one rank: [0]" in out.stdout
    assert f"world_size=4 is not allowed here: 4 ranks need about {4 * RANK_MIB} MiB" in out.stdout
    assert "this container has" in out.stdout and "of its 900 MiB" in out.stdout
