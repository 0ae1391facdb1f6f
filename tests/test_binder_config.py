"""binder/ is what mybinder builds; these checks catch the mistakes that would only show up there.

The full rehearsal (a fresh environment from binder/requirements.txt, postBuild, every notebook
through binder/start under Binder's memory cap) is ``scripts/binder_check.sh``; it installs
packages, so it is run by hand rather than in every test run.
"""
import os
import re
import subprocess
import sys

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINDER = os.path.join(REPO, "binder")


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _requirements() -> list[str]:
    with open(os.path.join(BINDER, "requirements.txt")) as f:
        return [line.strip() for line in f if line.strip() and not line.startswith(("#", "-"))]


def test_every_runtime_dependency_is_in_binders_requirements():
    # postBuild installs the course with --no-deps, so anything missing here is missing on Binder.
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        needed = {_name(d) for d in tomllib.load(f)["project"]["dependencies"]}
    listed = {_name(r) for r in _requirements()}
    assert needed <= listed, f"add to binder/requirements.txt: {sorted(needed - listed)}"


def test_binder_takes_a_cpu_only_torch_pinned_to_the_tested_release():
    torch_lines = [r for r in _requirements() if _name(r) == "torch"]
    assert len(torch_lines) == 1 and torch_lines[0].endswith("+cpu"), torch_lines
    with open(os.path.join(BINDER, "requirements.txt")) as f:
        assert "--extra-index-url https://download.pytorch.org/whl/cpu" in f.read()
    with open(os.path.join(REPO, "Makefile")) as f:
        tested = re.search(r"TORCH\s*\?=\s*torch==([\d.]+)", f.read()).group(1)
    assert torch_lines[0] == f"torch=={tested}+cpu", "Binder should run the torch release the tests run"


def test_binder_scripts_are_executable_bash():
    for name in ("postBuild", "start"):
        path = os.path.join(BINDER, name)
        assert os.access(path, os.X_OK), f"binder/{name} must be executable"
        assert subprocess.run(["bash", "-n", path]).returncode == 0


def test_start_sets_binders_defaults_and_runs_the_command_it_is_given():
    env = {k: v for k, v in os.environ.items() if k not in ("DPTEACH_WORLD_SIZE", "OMP_NUM_THREADS")}
    script = "import os, dpteach.ranks.world as w; print(os.environ['OMP_NUM_THREADS'], w.default_world_size())"
    out = subprocess.run([os.path.join(BINDER, "start"), sys.executable, "-c", script], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "2"]
    env["DPTEACH_WORLD_SIZE"] = "3"  # a learner's own choice wins
    out = subprocess.run([os.path.join(BINDER, "start"), sys.executable, "-c", script], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["1", "3"]
