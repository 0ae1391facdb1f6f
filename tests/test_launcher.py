"""The launcher on real processes: results, output, and every way a world can go wrong."""
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
import torch.distributed as dist

import dpteach
from dpteach.ranks.backend import Placement, backend_for

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def alive(pid: int) -> bool:
    """A process counts as alive unless it is gone or a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_for_files(paths, seconds=60.0):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if all(os.path.exists(p) and open(p).read().strip() for p in paths):
            return
        time.sleep(0.1)
    raise AssertionError(f"ranks never wrote {paths}")


def _sum_of_ranks(offset, scale=1):
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return {"rank": dist.get_rank(), "world": dist.get_world_size(), "value": offset + scale * t.item(),
            "backend": backend_for(dpteach.device().type), "device": str(dpteach.device())}


def test_results_come_back_in_rank_order_with_args_and_kwargs():
    results = dpteach.launch(_sum_of_ranks, 3, args=(10,), kwargs={"scale": 2})
    assert [r["rank"] for r in results] == [0, 1, 2]
    assert all(r["world"] == 3 and r["value"] == 10 + 2 * (0 + 1 + 2) for r in results)
    assert {r["backend"] for r in results} == {"gloo"}


def test_lambdas_and_closures_travel_by_value():
    secret = [5, 6]
    results = dpteach.launch(lambda k: secret[dist.get_rank()] * k, 2, args=(3,))
    assert results == [15, 18]


def test_each_line_of_output_is_prefixed_with_its_rank(capfd):
    dpteach.launch(lambda: print(f"hello from {dist.get_rank()}\nsecond line"), 2)
    out = capfd.readouterr().out
    for rank in (0, 1):
        assert f"[rank {rank}] hello from {rank}" in out
    assert out.count("second line") == 2 and "[rank 1] second line" in out


def _raise_on_rank_one():
    if dist.get_rank() == 1:
        raise KeyError("the missing key")
    dist.barrier()  # the others wait for rank 1 forever: they must be stopped, not waited for


def test_a_raising_rank_is_reraised_with_its_rank_and_traceback():
    start = time.monotonic()
    with pytest.raises(dpteach.RankError) as info:
        dpteach.launch(_raise_on_rank_one, 3, timeout=120)
    err = info.value
    assert err.rank == 1 and err.exc_type == "KeyError"
    assert "the missing key" in str(err) and "_raise_on_rank_one" in err.rank_traceback
    assert isinstance(err.__cause__, KeyError)
    assert time.monotonic() - start < 60, "the waiting ranks were not stopped"


@pytest.mark.slow  # more than 4 s on 2 cores: in `make test`, not `make test-fast`
def test_a_world_that_cannot_form_is_started_once_more_then_reported(monkeypatch, capfd):
    # A real failure to connect: gloo is told to use a network interface this machine does not have.
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "no-such-if0")
    with pytest.raises(dpteach.RankError) as info:
        dpteach.launch(lambda: "fn ran", 2, timeout=120)
    err = info.value
    assert err.while_joining and err.exc_type == "RuntimeError" and "no-such-if0" in str(err)
    assert capfd.readouterr().out.count("could not form a world") == 1  # one more try, not a loop
    # An exception raised by fn itself is fn's: it is reported at once, never retried.
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    with pytest.raises(dpteach.RankError) as info:
        dpteach.launch(_raise_on_rank_one, 2, timeout=120)
    assert not info.value.while_joining
    assert "could not form a world" not in capfd.readouterr().out


def _exit_hard():
    if dist.get_rank() == 0:
        os._exit(3)
    dist.barrier()


def test_a_rank_that_dies_is_reported_with_its_exit_code():
    with pytest.raises(dpteach.RankError) as info:
        dpteach.launch(_exit_hard, 2, timeout=120)
    assert info.value.rank == 0 and info.value.exit_code == 3
    assert "exited with code 3" in str(info.value)


def _debug_level_seen_at_import():
    return dist.get_debug_level().name, os.environ.get("DPTEACH_TEST_MARK")


def test_env_reaches_every_rank_before_torch_reads_it():
    # TORCH_DISTRIBUTED_DEBUG is read when torch.distributed is imported: it must be in the rank's
    # environment from the start, which is what env= is for.
    env = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL", "DPTEACH_TEST_MARK": "set"}
    assert dpteach.launch(_debug_level_seen_at_import, 2, env=env, timeout=120) == [("DETAIL", "set")] * 2
    assert os.environ.get("DPTEACH_TEST_MARK") is None  # the caller's own environment is untouched


def test_env_that_cannot_reach_torchruns_running_ranks_is_refused(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")  # this process now looks like a rank torchrun started
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    with pytest.raises(ValueError, match="cannot be applied under torchrun") as info:
        dpteach.launch(_sum_of_ranks, None, args=(0,), env={"TORCH_DISTRIBUTED_DEBUG": "OFF"})
    assert "'TORCH_DISTRIBUTED_DEBUG': 'OFF'" in str(info.value)


def _native_abort():
    if dist.get_rank() == 0:
        print("about to abort from native code", flush=True)
        os.abort()
    dist.barrier()


def test_a_rank_that_dies_without_a_traceback_reports_its_last_output():
    with pytest.raises(dpteach.RankError) as info:
        dpteach.launch(_native_abort, 2, timeout=120, show_output=False)
    assert info.value.rank == 0 and info.value.exit_code == -signal.SIGABRT
    assert "about to abort from native code" in info.value.last_output
    assert "last output of rank 0" in str(info.value)


def _abort_after_returning():
    os._exit = lambda code: os.abort()  # the worker's very last call, made after the result is written
    return dist.get_rank()


def test_a_rank_that_crashes_after_returning_is_reported_as_such():
    with pytest.raises(dpteach.RankError) as info:
        dpteach.launch(_abort_after_returning, 2, timeout=120)
    assert "returned its result, then killed by SIGABRT (signal 6) while shutting down" in str(info.value)


def _killed_like_the_oom_killer_does():
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


def test_a_rank_killed_with_sigkill_points_at_memory():
    with pytest.raises(dpteach.RankError) as info:
        dpteach.launch(_killed_like_the_oom_killer_does, 2, timeout=120)
    assert info.value.rank == 1 and info.value.exit_code == -signal.SIGKILL
    assert "killed by SIGKILL (signal 9): usually the out-of-memory killer" in str(info.value)


def _hang_with_a_child(pid_dir):
    child = subprocess.Popen(["sleep", "1000"])
    with open(os.path.join(pid_dir, f"{dist.get_rank()}.pids"), "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    time.sleep(1000)


@pytest.mark.slow
def test_a_hang_times_out_and_leaves_no_process_behind(tmp_path):
    timeout = 8
    start = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        dpteach.launch(_hang_with_a_child, 2, args=(str(tmp_path),), timeout=timeout)
    elapsed = time.monotonic() - start
    assert "rank(s) [0, 1]" in str(info.value)
    assert elapsed < timeout + 10
    pids = [int(p) for r in (0, 1) for p in (tmp_path / f"{r}.pids").read_text().split()]
    time.sleep(0.5)
    assert not [p for p in pids if alive(p)], "ranks or their children survived the timeout"


def test_interrupting_the_caller_stops_every_rank(tmp_path):
    script = tmp_path / "interrupted.py"
    script.write_text(textwrap.dedent(f"""
        import os, time, subprocess, torch.distributed as dist, dpteach
        def hang(pid_dir):
            child = subprocess.Popen(["sleep", "1000"])
            open(os.path.join(pid_dir, f"{{dist.get_rank()}}.pids"), "w").write(f"{{os.getpid()}} {{child.pid}}")
            time.sleep(1000)
        try:
            dpteach.launch(hang, 2, args=({str(tmp_path)!r},), timeout=300)
        except KeyboardInterrupt:
            print("INTERRUPTED", flush=True)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    wait_for_files([tmp_path / "0.pids", tmp_path / "1.pids"])
    proc.send_signal(signal.SIGINT)  # what Ctrl-C or Jupyter's interrupt button sends
    out, _ = proc.communicate(timeout=30)
    assert "INTERRUPTED" in out
    pids = [int(p) for r in (0, 1) for p in (tmp_path / f"{r}.pids").read_text().split()]
    time.sleep(0.5)
    assert not [p for p in pids if alive(p)]


@pytest.mark.slow  # more than 4 s on 2 cores: in `make test`, not `make test-fast`
def test_a_function_defined_in_main_runs_and_main_is_not_rerun(tmp_path):
    script = tmp_path / "no_guard.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.distributed as dist, dpteach
        print("SCRIPT BODY RAN", flush=True)
        def double_rank():
            return 2 * dist.get_rank()
        print("RESULT", dpteach.launch(double_rank, 3), flush=True)
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "RESULT [0, 2, 4]" in out.stdout
    assert out.stdout.count("SCRIPT BODY RAN") == 1


def test_two_launches_at_once_do_not_collide():
    results, errors = {}, []

    def one(key):
        try:
            results[key] = dpteach.launch(_sum_of_ranks, 2, args=(key,), show_output=False)
        except Exception as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(k,)) for k in (100, 200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    assert [r["value"] for r in results[100]] == [101, 101]
    assert [r["value"] for r in results[200]] == [201, 201]


def _nested():
    return dpteach.launch(lambda: 1, 2)


def test_a_rank_cannot_start_a_world_of_its_own():
    with pytest.raises(dpteach.RankError, match="inside a rank"):
        dpteach.launch(_nested, 1)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"world_size": 0}, "world_size=0 is not allowed"),
    ({"world_size": -2}, "world_size=-2 is not allowed"),
    ({"world_size": "4"}, "world_size='4' is not allowed"),
    ({"world_size": True}, "world_size=True is not allowed"),
    ({"world_size": 2, "backend": "mpi"}, "backend='mpi' is not allowed: choose one of auto, gloo, nccl"),
    ({"world_size": 2, "device": "tpu"}, "device='tpu' is not allowed"),
    ({"world_size": 2, "timeout": 0}, "timeout=0 is not allowed"),
    ({"world_size": 2, "backend": "nccl", "device": "cpu"}, "backend='nccl' with device='cpu' is not allowed"),
    ({"world_size": 2, "env": {"A": 1}}, "env={'A': 1} is not allowed"),
    ({"world_size": 2, "env": "A=1"}, "env='A=1' is not allowed"),
])
def test_bad_arguments_are_refused_before_anything_starts(kwargs, fragment):
    before = set(os.listdir("/proc"))
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(")):
        dpteach.launch(_sum_of_ranks, **kwargs)
    started = [p for p in set(os.listdir("/proc")) - before if p.isdigit() and "dpteach.ranks.worker" in _cmdline(p)]
    assert not started


def _cmdline(pid):
    try:
        return open(f"/proc/{pid}/cmdline").read()
    except OSError:
        return ""


def test_nccl_without_enough_gpus_says_what_is_allowed():
    with pytest.raises(ValueError, match="backend='nccl'"):
        dpteach.launch(_sum_of_ranks, 64, backend="nccl")


def test_a_function_that_cannot_be_sent_is_refused():
    lock = threading.Lock()
    with pytest.raises(TypeError, match="cannot be sent to the ranks"):
        dpteach.launch(lambda: lock, 2)


def _report_progress():
    if dist.get_rank() == 0:
        dpteach.report_progress(0, total=3, desc="counting")
        for _ in range(3):
            time.sleep(0.2)
            dpteach.report_progress(1)
    dist.barrier()
    return True


def test_rank_zero_drives_a_progress_bar_in_the_caller(capfd):
    assert dpteach.launch(_report_progress, 2) == [True, True]
    err = capfd.readouterr().err
    assert "counting" in err and "3/3" in err
    # before the run's own progress, the ranks' start-up: a bar that counts ranks joining the world
    assert "starting 2 ranks" in err and "2/2" in err.split("counting")[0]


def _rename_progress():
    if dist.get_rank() == 0:
        dpteach.report_progress(0, total=2, desc="batch 32")
        time.sleep(0.5)
        dpteach.report_progress(1, desc="batch 64")  # the bar is renamed as the run goes
        time.sleep(0.5)
        dpteach.report_progress(1)
    dist.barrier()
    return True


def test_a_run_can_rename_its_bar_as_it_goes(capfd):
    assert dpteach.launch(_rename_progress, 2) == [True, True]
    err = capfd.readouterr().err
    assert "batch 32" in err and "batch 64" in err and err.index("batch 32") < err.index("batch 64")


def test_the_bar_stays_text_on_stderr_in_a_process_that_loaded_ipykernel(capfd):
    # `dpteach lab` reads the kernel's metadata from ipykernel, which imports ipykernel.zmqshell; tqdm.auto
    # takes that module's presence for a notebook and prints a widget's text on stdout instead
    import ipykernel.zmqshell  # noqa: F401
    assert dpteach.launch(_report_progress, 2) == [True, True]
    out, err = capfd.readouterr()
    assert "counting" in err and "counting" not in out and "starting 2 ranks" not in out


@pytest.mark.slow  # more than 4 s on 2 cores: in `make test`, not `make test-fast`
def test_under_torchrun_launch_joins_the_existing_world(tmp_path):
    script = tmp_path / "joined.py"
    script.write_text(textwrap.dedent("""
        import os, torch, torch.distributed as dist, dpteach
        def who():
            return (dist.get_rank(), dist.get_world_size(), os.getpid())
        results = dpteach.launch(who, 2)
        assert [r[0] for r in results] == [0, 1] and len({r[2] for r in results}) == 2
        assert results[dist.get_rank()][2] == os.getpid(), "the function ran in a spawned child"
        try:
            dpteach.launch(who, 3)
        except ValueError as exc:
            message = str(exc)
        with open(os.path.join(os.path.dirname(__file__), f"joined{dist.get_rank()}"), "w") as f:
            f.write(message)
    """))
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(script)], capture_output=True, text=True, timeout=180, cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    for rank in (0, 1):  # each rank ran the function itself and refused a mismatched world size
        assert "world_size=3 does not match torchrun's WORLD_SIZE=2" in (tmp_path / f"joined{rank}").read_text()


def test_under_torchrun_a_failing_rank_ends_the_run_instead_of_hanging(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(textwrap.dedent("""
        import torch.distributed as dist, dpteach
        def fail_on_rank_one():
            if dist.get_rank() == 1:
                raise RuntimeError("rank one gives up")
            return dist.get_rank()
        dpteach.launch(fail_on_rank_one, 2)
    """))
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(script)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode != 0
    assert "rank one gives up" in out.stdout + out.stderr


def _backends_by_device():
    return {"cpu": backend_for("cpu"), "cuda": backend_for("cuda")}


def test_a_gloo_world_moves_tensors_of_either_device_with_gloo():
    (result,) = dpteach.launch(_backends_by_device, 1, backend="gloo")
    assert result["cpu"] == result["cuda"] == "gloo"


def test_an_nccl_world_carries_gloo_for_its_cpu_bookkeeping():
    placement = Placement(backend="nccl", device_type="cuda", gpus=2)
    assert placement.process_group_backend == "cpu:gloo,cuda:nccl"
    assert Placement(backend="gloo", device_type="cuda", gpus=1).process_group_backend == "gloo"


@pytest.mark.gpu
def test_nccl_world_of_one_on_the_gpu():
    (result,) = dpteach.launch(_sum_of_ranks, 1, args=(1,), backend="nccl")  # its all-reduce is on a CPU tensor
    assert result["backend"] == "nccl" and result["device"].startswith("cuda")
    (backends,) = dpteach.launch(_backends_by_device, 1, backend="nccl")
    assert backends["cpu"] == "gloo" and backends["cuda"] == "nccl", backends


@pytest.mark.gpu
def test_gloo_ranks_compute_on_the_one_gpu():
    results = dpteach.launch(_sum_of_ranks, 2, args=(0,), backend="gloo", device="cuda")
    assert all(r["backend"] == "gloo" and r["device"].startswith("cuda") for r in results)


def _cores_and_gloo_threads_cores():
    tensor = torch.ones(4)
    dist.all_reduce(tensor)  # gloo's threads exist now: they must have inherited the rank's core
    threads = os.listdir(f"/proc/{os.getpid()}/task")
    return sorted(os.sched_getaffinity(0)), sorted({c for t in threads for c in os.sched_getaffinity(int(t))})


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="pinning needs Linux and at least two cores")
def test_cpu_ranks_each_get_a_core_of_their_own_when_there_are_enough():
    allowed = sorted(os.sched_getaffinity(0))
    out = dpteach.launch(_cores_and_gloo_threads_cores, 2, backend="gloo", device="cpu")
    assert [cores for cores, _ in out] == [[allowed[0]], [allowed[1]]]
    assert [threads for _, threads in out] == [[allowed[0]], [allowed[1]]]


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="affinity is Linux-only")
def test_more_ranks_than_cores_share_them_all():
    allowed = sorted(os.sched_getaffinity(0))
    world = len(allowed) + 1
    out = dpteach.launch(_cores_and_gloo_threads_cores, world, backend="gloo", device="cpu", timeout=120)
    assert all(cores == allowed for cores, _ in out)


def _clock_origins_after_queued_gpu_work():
    from dpteach.replica.timeline import Timeline, start_together
    if dist.get_rank() == 0:
        torch.cuda._sleep(2_000_000_000)  # about a second of GPU cycles, queued and not yet run
    timeline = Timeline(dpteach.device())
    start_together(timeline)
    origins = [None] * dist.get_world_size()
    dist.all_gather_object(origins, timeline.origin)
    return origins


@pytest.mark.gpu
def test_ranks_start_their_clocks_together_even_with_gpu_work_queued():
    """The device is synchronised *before* the barrier: had rank 0 drained its queue after it, its
    clock would start about a second after rank 1's and the Gantt lanes would not line up."""
    origins = dpteach.launch(_clock_origins_after_queued_gpu_work, 2, backend="gloo", device="cuda")[0]
    assert abs(origins[0] - origins[1]) < 0.25, origins


def _ends_itself_on_rank_one():
    if dist.get_rank() == 1:
        os._exit(0)  # no exception, no result, exit code 0
    t = torch.ones(1)
    dist.all_reduce(t)  # rank 1 never comes
    return t.item()


def test_a_rank_that_exits_with_code_zero_without_a_result_is_a_failure_not_a_wait():
    with pytest.raises(dpteach.RankError, match=r"rank 1 ended its own process \(exit code 0\) without returning"):
        dpteach.launch(_ends_itself_on_rank_one, 2, timeout=120)
