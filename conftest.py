"""Test-session settings shared by tests/ and the notebooks run by nbval."""
import os
import tempfile


def pytest_configure(config):
    # The notebooks' kernels inherit this environment: quiz answers and grades recorded while the
    # suite runs go to a throwaway file, never to the learner's own progress.
    if "DPTEACH_PROGRESS" not in os.environ:
        folder = tempfile.mkdtemp(prefix="dpteach-test-progress-")
        os.environ["DPTEACH_PROGRESS"] = os.path.join(folder, "progress.json")
