"""What the lessons say about torch and torchft, held to the installed packages themselves.

Each test reads one fact the course states (lesson 13, lesson 14, the quizzes) from the code that decides it,
by running that code where it can run here, so a new torch that changes the fact fails here first.
"""
import os
import shutil
import subprocess
import sys

import pytest
import torch

MiB = 1024 * 1024


@pytest.mark.slow
@pytest.mark.parametrize("given, seen", [(None, "1"), ("3", "3")])
def test_torchrun_gives_its_workers_async_error_handling_1_unless_it_is_set(given, seen):
    """Lesson 13 and quiz fail-async-error-handling: ProcessGroupNCCL's own default is 3, but torchrun's local
    agent writes TORCH_NCCL_ASYNC_ERROR_HANDLING=1 into every worker's environment when it is unset."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_NCCL_ASYNC_ERROR_HANDLING"}
    if given is not None:
        env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = given
    printenv = shutil.which("printenv")
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
                          "--no-python", printenv, "TORCH_NCCL_ASYNC_ERROR_HANDLING"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [seen]


def test_torch_powersgd_orthogonalises_with_gram_schmidt_up_to_rank_2_and_qr_above(monkeypatch):
    """Lesson 14: Gram-Schmidt for rank <= 2 (and 16-bit floats), torch.linalg.qr above (``_orthogonalize``)."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
    calls = []
    real = powerSGD_hook._orthogonalize_gram_schmidt
    monkeypatch.setattr(powerSGD_hook, "_orthogonalize_gram_schmidt",
                        lambda m, epsilon=0: (calls.append(m.shape[2]), real(m, epsilon=epsilon)))
    for rank in (1, 2, 4, 16):
        matrices = torch.randn(1, 64, rank)
        powerSGD_hook._orthogonalize(matrices)
        assert torch.allclose(matrices[0].T @ matrices[0], torch.eye(rank), atol=1e-5)  # orthonormal either way
    assert calls == [1, 2]
    powerSGD_hook._orthogonalize(torch.randn(1, 64, 4, dtype=torch.bfloat16))
    assert calls == [1, 2, 4]  # 16-bit floats: Gram-Schmidt at any rank


def test_ddp_cuts_a_small_first_bucket_only_when_bucket_cap_mb_is_left_unset():
    """Lesson 14: passing bucket_cap_mb=25 gives one 25 MiB cap for every bucket; leaving it unset caps the first
    bucket at 1 MiB (``_DEFAULT_FIRST_BUCKET_BYTES``); the cap is in MiB."""
    from torch.nn.parallel.distributed import _BucketCapacityConfig
    unset, given = _BucketCapacityConfig.create(None, None, False), _BucketCapacityConfig.create(25, None, False)
    assert (unset.bucket_bytes_cap, unset.first_bucket_bytes_cap) == (25 * MiB, 1 * MiB)
    assert (given.bucket_bytes_cap, given.first_bucket_bytes_cap) == (25 * MiB, 25 * MiB)


def test_torchft_should_commit_is_agreed_within_one_replica_group():
    """Lesson 13 and training/fault_tolerant.py: the vote is the group's own, not the job's."""
    manager = pytest.importorskip("torchft.manager", reason="torchft has wheels for Linux on x86-64 only")
    assert "Different replica groups may return different values" in " ".join(manager.Manager.should_commit.__doc__.split())
