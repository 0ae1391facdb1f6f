"""Test-session settings shared by tests/ and the notebooks run by nbval."""
import os
import tempfile

import pytest

# What every test not marked ``gpu`` or ``multigpu`` runs with, so that its result does not depend on
# the machine: the course's own GPU count is capped at zero (``dpteach.ranks.backend.visible_gpus``), and
# the processes a test starts - ranks, torchrun, notebook kernels - see no GPU at all. A test of
# placement that simulates GPUs sets its own count (tests/test_placement.py).
CPU_ONLY = {"DPTEACH_GPUS": "0", "CUDA_VISIBLE_DEVICES": ""}


def pytest_configure(config):
    # The notebooks' kernels inherit this environment: quiz answers and grades recorded while the
    # suite runs go to a throwaway file, never to the learner's own progress.
    if "DPTEACH_PROGRESS" not in os.environ:
        folder = tempfile.mkdtemp(prefix="dpteach-test-progress-")
        os.environ["DPTEACH_PROGRESS"] = os.path.join(folder, "progress.json")
    # ... and the workspace a test's `dpteach lab --workspace` or `workspace init` chose is remembered there too,
    # not in the learner's ~/.dpteach (dpteach/workspace.py, remember)
    os.environ.setdefault("DPTEACH_HOME", tempfile.mkdtemp(prefix="dpteach-test-home-"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Run each test (and each notebook cell, whose kernel starts inside the first one) CPU-only,
    unless it is marked ``gpu`` or ``multigpu``; put the environment back afterwards."""
    if "gpu" in item.keywords or "multigpu" in item.keywords:
        yield
        return
    saved = {name: os.environ.get(name) for name in CPU_ONLY}
    os.environ.update(CPU_ONLY)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
