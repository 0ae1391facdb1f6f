"""The command line: the benchmark's JSON, the doctor's report, and errors before any rank starts."""
import os
import signal
import json
import subprocess
import sys
import time

import pytest

from dpteach.experiments.bench import parse_size
from dpteach.network.costmodel import fit_alpha_beta

CLI = [sys.executable, "-m", "dpteach.cli"]


def run_cli(*args, timeout=300):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow  # more than 4 s on 2 cores: in `make test`, not `make test-fast`
def test_bench_json_has_every_algorithm_and_size_with_consistent_bandwidths():
    out = run_cli("bench", "allreduce", "--world-size", "3", "--sizes", "4KiB,64KiB,1MiB", "--iters", "3",
                  "--warmup", "1", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["world_size"] == 3 and report["backend"] == "gloo" and report["device"] == "cpu"
    rows = report["rows"]
    assert {(r["algorithm"], r["bytes"]) for r in rows} == {
        (a, b) for a in ("builtin", "ring", "naive", "tree") for b in (4096, 65536, 1048576)}
    for r in rows:
        assert r["time_s"] > 0
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / r["time_s"] / 1e9)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 2 * (3 - 1) / 3)
    # The reported fit is the cost model's fit of the ring's rows (their values are timing noise on
    # a busy machine, so only their consistency is asserted, and that the fit stays physical).
    fit, expected = report["fit"], fit_alpha_beta([(r["bytes"], 3, r["time_s"]) for r in rows if r["algorithm"] == "ring"])
    assert fit["alpha_s"] == pytest.approx(expected.link.alpha_s)
    assert fit["beta_s_per_byte"] == pytest.approx(expected.link.beta_s_per_byte)
    assert fit["alpha_s"] >= 0 and fit["beta_s_per_byte"] >= 0


def test_bench_table_names_the_fit():
    out = run_cli("bench", "allreduce", "-w", "2", "--sizes", "4KiB,256KiB", "--iters", "2",
                  "--algorithms", "builtin,ring")
    assert out.returncode == 0, out.stderr
    assert "busbw" in out.stdout and "alpha-beta fit" in out.stdout
    assert out.stdout.count(" ring ") == 2


@pytest.mark.parametrize("args, fragment", [
    (["--sizes", "12 parsecs"], "size '12 parsecs' is not allowed"),
    (["--algorithms", "ring,magic"], "is not allowed: choose from builtin, ring, naive, tree"),
    (["--iters", "0"], "iters=0 is not allowed"),
    (["--world-size", "0"], "world_size=0 is not allowed"),
    (["--backend", "mpi"], "backend='mpi' is not allowed"),
])
@pytest.mark.slow  # more than 4 s on 2 cores: in `make test`, not `make test-fast`
def test_bench_rejects_bad_options_with_a_clear_message(args, fragment):
    out = run_cli("bench", "allreduce", *args, timeout=60)
    assert out.returncode == 2
    assert fragment in out.stderr and "Traceback" not in out.stderr


def test_parse_size_units():
    assert parse_size("4KiB") == 4096 and parse_size("1MiB") == 1 << 20 and parse_size("100") == 100
    with pytest.raises(ValueError, match="size '2' is not allowed"):
        parse_size("2")


@pytest.mark.slow  # more than 4 s on 2 cores: in `make test`, not `make test-fast`
def test_doctor_reports_the_backend_and_passes_its_smoke_test():
    out = run_cli("doctor", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["gloo"] is True and report["cpus"] >= 1
    assert report["placement"]["backend"] in ("gloo", "nccl")
    assert report["smoke"]["ok"] is True
    for rank in report["smoke"]["per_rank"]:
        assert rank["builtin"]["ok"] and rank["ring"]["ok"]


@pytest.mark.slow  # more than 4 s on 2 cores: in `make test`, not `make test-fast`
def test_dpteach_lab_answers_as_this_user_and_a_sigterm_leaves_no_server_or_kernel_behind(tmp_path):
    """The README's first command, run as whoever runs the tests (root in CI and in most containers, where
    JupyterLab refuses to start unless told it may); then stopped as a process manager or a closed session
    stops it - SIGTERM to that one process, not to its group - with a kernel running: nothing may be left."""
    import shutil
    import socket
    import urllib.request
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    course = tmp_path / "course"  # a copy: dpteach lab writes kernel metadata into the notebooks it opens
    for folder in ("notebooks", "exercises"):
        shutil.copytree(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), folder), course / folder)
    runtime, token = tmp_path / "runtime", "dpteach-test-token"
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(runtime), "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"),
           "DPTEACH_COURSE": str(course)}
    server = subprocess.Popen([sys.executable, "-m", "dpteach", "lab", "--no-browser", "--port", str(port),
                               "--", "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline, answer = time.monotonic() + 90, None
        while time.monotonic() < deadline and server.poll() is None and answer is None:
            try:
                with urllib.request.urlopen(f"{base}/api", timeout=2) as response:
                    answer = json.loads(response.read())
            except OSError:
                time.sleep(0.5)
        output = "" if server.poll() is None else server.stdout.read().decode(errors="replace")
        assert answer is not None and "version" in answer, f"no answer from dpteach lab; it said:\n{output[-3000:]}"

        request = urllib.request.Request(f"{base}/api/kernels?token={token}", data=b"{}", method="POST")
        with urllib.request.urlopen(request, timeout=60) as response:
            kernel_id = json.loads(response.read())["id"]
        kernel = _pid_of_kernel(kernel_id, deadline=time.monotonic() + 60)
        server.send_signal(signal.SIGTERM)  # the process the learner started, alone
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("dpteach lab was sent SIGTERM and still ran 60 s later")
        # the kernel, and whatever `dpteach lab` started in its own process group (a server it only waited on)
        left = [pid for pid in (kernel, *_group(server.pid)) if _running(pid, deadline=time.monotonic() + 30)]
        assert not left, f"after SIGTERM these still run: {[_command_line(pid) for pid in left]}"
    finally:  # whatever the test found, nothing of this lab outlives it (its kernels lead sessions of their own)
        for pid in [server.pid, *([kernel] if "kernel" in locals() else [])]:
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        server.wait(timeout=30)


def _pid_of_kernel(kernel_id: str, deadline: float) -> int:
    """The process of the kernel with this id (its command line names its connection file, kernel-ID.json)."""
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if entry.isdigit() and f"kernel-{kernel_id}.json" in _command_line(int(entry)):
                return int(entry)
        time.sleep(0.2)
    raise AssertionError(f"no process runs the kernel {kernel_id}")


def _group(pgid: int) -> list[int]:
    """The processes whose process group is ``pgid``."""
    members = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if entry.isdigit() and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def _command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _running(pid: int, deadline: float) -> bool:
    """Whether ``pid`` still runs (a zombie does not) after waiting until ``deadline`` for it to end."""
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        if state == "Z" or time.monotonic() > deadline:
            return state != "Z"
        time.sleep(0.2)


def test_lab_gives_the_notebooks_the_kernel_metadata_jupyterlab_would_write(tmp_path):
    """So that no lesson opens marked as modified (tests/test_browser_notebooks.py opens each and checks)."""
    import shutil
    from dpteach.commands.lab import align_kernel_metadata, kernel_metadata
    shutil.copy(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks", "00_start_here.ipynb"), tmp_path / "a.ipynb")
    notebook = json.loads((tmp_path / "a.ipynb").read_text())
    notebook["metadata"]["language_info"] = {"name": "python", "version": "0.0"}
    (tmp_path / "a.ipynb").write_text(json.dumps(notebook))
    assert align_kernel_metadata([tmp_path / "a.ipynb"]) == [tmp_path / "a.ipynb"]
    aligned = json.loads((tmp_path / "a.ipynb").read_text())
    assert {k: aligned["metadata"][k] for k in kernel_metadata()} == kernel_metadata()
    assert aligned["cells"] == notebook["cells"] and aligned["metadata"]["dpteach"] == notebook["metadata"]["dpteach"]
    assert align_kernel_metadata([tmp_path / "a.ipynb"]) == []  # nothing to do the second time
