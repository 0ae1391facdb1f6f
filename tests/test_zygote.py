"""CPU ranks are forked from a zygote that has imported torch once: what a rank sees must not change."""
import os
import signal
import time

import pytest

import dpteach


def stat_of(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def parent_of(pid: int) -> int:
    return int(stat_of(pid)[1])


def cmdline_of(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode()


def gone(pid: int, seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            if stat_of(pid)[0] == "Z":
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def _who_am_i():
    with open("/proc/self/environ", "rb") as f:
        start_env = f.read().split(b"\0")
    with open("/proc/self/comm") as f:
        comm = f.read().strip()
    return {"pid": os.getpid(), "parent": os.getppid(), "comm": comm,
            "flag_at_start": b"ZYGOTE_TEST_IMPORT_FLAG=1" in start_env,
            "flag_now": os.environ.get("ZYGOTE_TEST_IMPORT_FLAG")}


pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc")


def test_cpu_ranks_of_successive_launches_are_forked_by_one_zygote():
    first = dpteach.launch(_who_am_i, 2, show_output=False, progress=False)
    second = dpteach.launch(_who_am_i, 2, show_output=False, progress=False)
    zygote = first[0]["parent"]
    assert {r["parent"] for r in first + second} == {zygote}
    assert "dpteach.ranks.zygote" in cmdline_of(zygote) and parent_of(zygote) == os.getpid()
    assert [r["comm"] for r in first] == ["dpteach-rank0", "dpteach-rank1"]
    assert all(gone(r["pid"]) for r in first + second)  # the ranks end with their launch; the zygote stays
    assert not gone(zygote, seconds=0.2)


def test_a_variable_read_at_import_gets_a_zygote_started_with_it():
    plain = dpteach.launch(_who_am_i, 2, show_output=False, progress=False)
    flagged = dpteach.launch(_who_am_i, 2, env={"ZYGOTE_TEST_IMPORT_FLAG": "1"}, show_output=False, progress=False)
    assert [r["flag_at_start"] for r in plain] == [False, False]
    # The variable was in the zygote's environment when it imported torch, not set afterwards.
    assert [(r["flag_at_start"], r["flag_now"]) for r in flagged] == [(True, "1")] * 2
    assert flagged[0]["parent"] != plain[0]["parent"]
    again = dpteach.launch(_who_am_i, 2, show_output=False, progress=False)
    assert again[0]["parent"] == plain[0]["parent"]  # both kinds kept: no start-up paid twice


def test_a_thread_count_is_applied_in_the_child_as_a_fresh_process_would_see_it():
    import subprocess
    import sys

    from dpteach.ranks.processes import rank_start_env
    from dpteach.ranks.zygote import popen_python

    code = ("import os, torch\nprint(os.getppid())\n"
            "print('\\n'.join(l for l in torch.__config__.parallel_info().splitlines() if 'threads()' in l))")
    env = {**rank_start_env(), "OMP_NUM_THREADS": "1"}
    fresh = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    forked = popen_python(["-c", code], env, stdout=subprocess.PIPE, text=True)
    parent, *threads = forked.stdout.read().splitlines()
    assert forked.wait(timeout=60) == 0
    assert threads == fresh.splitlines()[1:] and threads[0].endswith("get_num_threads() : 1")
    plain = dpteach.launch(_who_am_i, 1, show_output=False, progress=False)[0]
    assert int(parent) == plain["parent"]  # the same zygote: OMP_NUM_THREADS=1 does not key one


def test_a_third_kind_retires_the_oldest_zygote_once_its_ranks_are_done():
    seen = [dpteach.launch(_who_am_i, 1, env={"ZYGOTE_TEST_KIND": kind}, show_output=False, progress=False)[0]
            for kind in ("a", "b", "c")]
    zygotes = [r["parent"] for r in seen]
    assert len(set(zygotes)) == 3
    assert gone(zygotes[0]) and not gone(zygotes[2], seconds=0.2)


def test_fresh_ranks_when_asked(monkeypatch):
    monkeypatch.setenv("DPTEACH_FRESH_RANKS", "1")
    ranks = dpteach.launch(_who_am_i, 2, show_output=False, progress=False)
    assert {r["parent"] for r in ranks} == {os.getpid()}


def _kill_my_zygote():
    import torch.distributed as dist

    dist.barrier()
    if dist.get_rank() == 0:
        os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(60)


def test_a_zygote_that_dies_under_its_ranks_fails_the_launch_instead_of_hanging():
    with pytest.raises(dpteach.RankError) as info:  # not the TimeoutError of a launch left waiting
        dpteach.launch(_kill_my_zygote, 2, timeout=50, show_output=False, progress=False)
    assert info.value.exit_code == 70  # the worker's "my parent is gone" exit
    assert dpteach.launch(_who_am_i, 2, show_output=False, progress=False)[0]["comm"] == "dpteach-rank0"


def test_popen_python_runs_code_and_modules_as_python_would(tmp_path):
    import subprocess

    from dpteach.ranks.zygote import popen_python

    env = dict(os.environ)
    code = ("import os, sys\nprint(sys.argv[1:], os.getppid(), flush=True)\n"
            "print('to stderr', file=sys.stderr)\nsys.exit(3)")
    child = popen_python(["-c", code, "a", "b"], env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = child.stdout.read().splitlines()
    assert child.wait(timeout=60) == 3
    words = lines[0].rsplit(" ", 1)
    assert words[0] == "['a', 'b']" and "dpteach.ranks.zygote" in cmdline_of(int(words[1]))
    assert "to stderr" in lines
    with open(tmp_path / "log", "w") as log:
        module = popen_python(["-m", "json.tool", "--no-such-option"], env, stdout=subprocess.DEVNULL, stderr=log)
        assert module.wait(timeout=60) == 2  # argparse's usage error, as `python -m json.tool` exits
    assert "unrecognized arguments: --no-such-option" in (tmp_path / "log").read_text()
    with open(tmp_path / "raised", "w") as log:
        raised = popen_python(["-c", "raise KeyError('nope')"], env, stderr=log)
        assert raised.wait(timeout=60) == 1
    assert "KeyError: 'nope'" in (tmp_path / "raised").read_text()


def test_popen_python_is_a_plain_popen_when_fresh_processes_are_asked_for(monkeypatch):
    import subprocess

    from dpteach.ranks.zygote import popen_python

    monkeypatch.setenv("DPTEACH_FRESH_RANKS", "1")
    child = popen_python(["-c", "import os; print(os.getppid())"], dict(os.environ), stdout=subprocess.PIPE, text=True)
    assert isinstance(child, subprocess.Popen)
    assert int(child.stdout.read()) == os.getpid() and child.wait(timeout=60) == 0


# -- guests: a program that torchrun starts as `python -m dpteach.ranks.zygote_guest ...` ---------------------------
def _guest(code: str, env_extra: dict | None = None, **popen):
    import subprocess
    import sys

    from dpteach.ranks.processes import rank_start_env
    from dpteach.ranks.zygote import GUEST_SOCKET, _zygote_for

    env = rank_start_env()
    zygote = _zygote_for(env)  # the one a launch would use; a guest finds it by its socket, as torchrun's workers do
    env = {**env, GUEST_SOCKET: zygote.guest_path, **(env_extra or {})}
    return subprocess.Popen([sys.executable, "-m", "dpteach.ranks.zygote_guest", "-c", code], env=env,
                            start_new_session=True, stdout=subprocess.PIPE, text=True, **popen)


WHO = "import os\nprint(os.getpid(), os.getppid(), open('/proc/self/comm').read().strip(), flush=True)\n"


def test_a_guest_is_forked_by_the_zygote_and_ends_as_its_program_ends():
    exits = _guest(WHO + "raise SystemExit(3)")
    pid, parent, comm = exits.stdout.readline().split()
    assert exits.wait(timeout=60) == 3
    assert int(pid) != exits.pid and "dpteach.ranks.zygote" in cmdline_of(int(parent)) and comm == "dpteach-forked"
    killed = _guest("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    assert killed.wait(timeout=60) == -signal.SIGKILL  # torchrun reads "exitcode: -9", as from the program itself


def test_a_signal_to_the_guest_reaches_its_program(tmp_path):
    code = ("import signal, sys, time\n"
            f"signal.signal(signal.SIGTERM, lambda *_: (open({str(tmp_path / 'got')!r}, 'w').write('TERM'), sys.exit(5)))\n"
            + WHO + "time.sleep(60)\n")
    guest = _guest(code)
    guest.stdout.readline()  # printed once its handler is in place
    os.killpg(guest.pid, signal.SIGTERM)  # how torchrun stops a worker (subprocess_handler.py, close)
    assert guest.wait(timeout=30) == 5 and (tmp_path / "got").read_text() == "TERM"


def test_a_guest_killed_outright_takes_its_program_with_it():
    guest = _guest(WHO + "import time\ntime.sleep(120)\n")
    program = int(guest.stdout.readline().split()[0])
    guest.kill()
    assert guest.wait(timeout=30) == -signal.SIGKILL
    assert gone(program)  # the zygote saw the guest's socket close and killed what it had asked for


def test_a_guest_that_would_import_torch_differently_runs_a_fresh_interpreter():
    import subprocess

    guest = _guest(WHO, {"ZYGOTE_TEST_IMPORT_FLAG": "1", "DPTEACH_GUEST_VERBOSE": "1"}, stderr=subprocess.PIPE)
    pid, parent, comm = guest.stdout.readline().split()
    assert guest.wait(timeout=60) == 0
    assert int(pid) == guest.pid and int(parent) == os.getpid()  # the guest became the program (exec)
    assert "ZYGOTE_TEST_IMPORT_FLAG" in guest.stderr.read()  # and said why


def test_a_retiring_zygote_still_forks_for_its_launcher_and_sends_guests_to_a_fresh_interpreter():
    import subprocess
    import sys

    from dpteach.ranks.processes import rank_start_env
    from dpteach.ranks.zygote import GUEST_SOCKET, Zygote, import_time_env

    env = {**rank_start_env(), "ZYGOTE_TEST_KIND": "retiring"}
    zygote, first = Zygote(import_time_env(env)), None
    try:
        with open(os.devnull, "w") as null:
            first = zygote.fork(env, os.getcwd(), null.fileno(), null.fileno(), argv=["-c", "import time; time.sleep(30)"])
            zygote.retire()  # a launch that got this zygote just before may still ask it to fork
            late = zygote.fork(env, os.getcwd(), null.fileno(), null.fileno(), argv=["-c", "pass"])
        assert late != first
        guest = subprocess.run([sys.executable, "-m", "dpteach.ranks.zygote_guest", "-c", WHO],
                               env={**env, GUEST_SOCKET: zygote.guest_path, "DPTEACH_GUEST_VERBOSE": "1"},
                               capture_output=True, text=True, timeout=60)
        assert "retiring" in guest.stderr and int(guest.stdout.split()[1]) == os.getpid()
    finally:
        if first is not None:
            os.kill(first, signal.SIGKILL)
        zygote.close()
