"""Shared test set-up: GPU markers skip with a reason where the hardware is absent."""
import os

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        if "gpu" in item.keywords and gpus < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU; this machine has none"))
        if "multigpu" in item.keywords and gpus < 2:
            item.add_marker(pytest.mark.skip(reason=f"multi-rank NCCL needs 2+ GPUs; this machine has {gpus}"))


@pytest.fixture(autouse=True)
def _private_progress_store(tmp_path, monkeypatch):
    """Never write a learner's real progress file from the tests."""
    if "DPTEACH_PROGRESS" not in os.environ:
        monkeypatch.setenv("DPTEACH_PROGRESS", str(tmp_path / "progress.json"))
