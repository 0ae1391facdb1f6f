"""The same commands, unchanged, under torch's own launcher (the way they run across nodes)."""
import json
import subprocess
import sys
import time

import pytest

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def torchrun(*args, timeout=300):
    return subprocess.run([*TORCHRUN, "-m", "dpteach.cli", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_compare_runs_under_torchrun_and_reports_once():
    out = torchrun("compare", "--steps", "3", "--batch", "8", "--strategies", "local,naive,overlap,ddp", "--json")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    report = json.loads(out.stdout)  # only rank 0 printed: the whole stdout is one JSON object
    assert report["world_size"] == 2 and report["backend"] == "gloo"
    rows = {r["strategy"]: r for r in report["rows"]}
    for name in ("naive", "overlap", "ddp"):
        assert rows[name]["replicas_identical"] and rows[name]["max_abs_diff_vs_single"] <= 1e-5


def test_bench_runs_under_torchrun():
    out = torchrun("bench", "allreduce", "--sizes", "4KiB,64KiB", "--iters", "2", "--json")
    assert out.returncode == 0, out.stderr[-4000:]
    report = json.loads(out.stdout)
    assert report["world_size"] == 2 and len(report["rows"]) == 8


def test_a_world_size_that_contradicts_torchrun_is_refused():
    out = torchrun("compare", "--world-size", "3", "--steps", "2")
    assert out.returncode != 0
    assert "world_size=3 does not match torchrun's WORLD_SIZE=2" in out.stderr


def run_script(tmp_path, body, timeout=120):
    script = tmp_path / "job.py"
    script.write_text(body)
    start = time.monotonic()
    out = subprocess.run([*TORCHRUN, str(script)], capture_output=True, text=True, timeout=timeout)
    return out, time.monotonic() - start


RAISES_IN_FN = """
import torch, torch.distributed as dist, dpteach
def work():
    if dist.get_rank() == 1:
        raise RuntimeError("rank one gives up")
    t = torch.ones(1)
    dist.all_reduce(t)  # rank 1 never comes: without a prompt exit this waits out the timeout
    return t.item()
dpteach.launch(work, None, timeout=TIMEOUT)
"""

RAISES_OUTSIDE_FN = """
import torch.distributed as dist, dpteach
dpteach.launch(lambda: 1, None, timeout=TIMEOUT)
if dist.get_rank() == 1:
    raise RuntimeError("rank one fails between two launches")
dpteach.launch(lambda: 2, None, timeout=TIMEOUT)  # rank 0 waits here for a rank that has gone
"""


@pytest.mark.slow  # more than 4 s on 2 cores: in `make test`, not `make test-fast`
@pytest.mark.parametrize("body", [RAISES_IN_FN, RAISES_OUTSIDE_FN], ids=["in_fn", "outside_fn"])
def test_a_failing_rank_ends_the_torchrun_job_promptly_with_its_error_shown(tmp_path, body):
    timeout = 20
    out, took = run_script(tmp_path, body.replace("TIMEOUT", str(timeout)))
    assert out.returncode != 0
    assert "rank one" in out.stderr  # the failing rank's own error, not only torchrun's summary
    assert took < timeout + 10, f"the job took {took:.0f} s to end"


def test_a_command_that_fails_under_torchrun_exits_nonzero_and_promptly():
    out = torchrun("compare", "--steps", "2", "--strategies", "naive,nonsense", timeout=120)
    assert out.returncode != 0
    assert "nonsense" in out.stderr


def test_launch_refuses_a_backend_or_device_other_than_the_joined_worlds(tmp_path):
    body = """
import torch.distributed as dist, dpteach
dist.init_process_group("gloo")  # the user's own world: launch joins it and checks each call against it
assert dpteach.launch(lambda: dist.get_rank(), None) == [0, 1]
for kwargs in ({"backend": "nccl"}, {"device": "cuda"}):
    try:
        dpteach.launch(lambda: 0, None, **kwargs)
    except ValueError as exc:
        print("refused:", exc, flush=True)
dist.barrier()  # the user's world, the user's to end: together, then torn down
dist.destroy_process_group()
"""
    out, _ = run_script(tmp_path, body)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("refused:") == 4  # both ranks, both calls
    assert "backend='nccl' differs from the world this process already joined, which moves its tensors with 'gloo'" \
        in out.stdout
    assert "device='cuda' differs" in out.stdout
