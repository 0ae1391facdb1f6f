"""A ``Comm`` and the strategies on a process group smaller than the world: the seam a hybrid scheme (HSDP:
shard within a group, replicate across groups) is built on. Four gloo ranks as a 2 x 2 mesh; every rank
checks its results against PyTorch itself (a single-process step on its group's data)."""
import pytest
import torch
import torch.distributed as dist

import dpteach
from dpteach.network.comm import Comm

STRATEGIES = ["naive", "bucketed", "overlap", "deterministic", "zero1", "zero2", "zero3", "ddp", "fsdp"]


def _mesh():
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))


def _comm_on_a_group():
    mesh = _mesh()
    comm = Comm(None, group=mesh["shard"])  # ranks {0, 1} and {2, 3}
    members = dist.get_process_group_ranks(comm.group)
    x = torch.full((6,), float(dist.get_rank() + 1))
    comm.all_reduce(x)
    counted = comm.sent
    peer = 1 - comm.rank
    got = torch.empty(1)
    if comm.rank == 0:  # point to point by the group's own numbering
        comm.send(torch.tensor([10.0 * dist.get_rank()]), peer)
        sender = comm.recv(got)
    else:
        sender = comm.recv(got, 0)
        comm.send(torch.tensor([10.0 * dist.get_rank()]), peer)
    refusals = []
    for bad in (lambda: Comm(None, group=mesh), lambda: Comm(None, group="shard"),
                lambda: Comm(None, all_reduce="ring", group=mesh["shard"])):
        try:
            bad()
        except ValueError as e:
            refusals.append(str(e))
    return {"members": members, "sum": x.tolist(), "counted": counted, "rank_in_group": comm.rank,
            "size": comm.size, "sender": sender, "got": got.item(), "refusals": refusals}


@pytest.mark.slow
def test_a_comm_on_a_group_reduces_counts_and_numbers_ranks_within_it():
    out = dpteach.launch(_comm_on_a_group, 4, timeout=120, backend="gloo", device="cpu", show_output=False)
    for rank, r in enumerate(out):
        assert r["members"] == ([0, 1] if rank < 2 else [2, 3])
        assert r["sum"] == [float(sum(m + 1 for m in r["members"]))] * 6   # the group's sum, not the world's
        assert r["counted"] == 6 * 4 * 2 * (2 - 1) // 2                       # a ring of 2 ranks: 2(W-1)/W of it
        assert (r["size"], r["rank_in_group"]) == (2, rank % 2)
        assert r["sender"] == 1 - rank % 2                                    # the peer, as the group numbers it
        assert r["got"] == 10.0 * r["members"][1 - rank % 2]
        assert len(r["refusals"]) == 3
        assert "group=" in r["refusals"][0] and "2 dimensions" in r["refusals"][0]
        assert "group='shard' is not allowed" in r["refusals"][1]
        assert "all_reduce='ring' is not allowed with a group" in r["refusals"][2]


def _one_step_per_strategy_on_a_group(names):
    from dpteach.ranks import context
    from dpteach.replica.data import loss_fn, make_dataset, sample_batch
    from dpteach.replica.models import build_model
    from dpteach.replica.build import flat_weights
    from dpteach.sync import make_strategy
    from dpteach.replica.timeline import Timeline
    mesh = _mesh()
    members = dist.get_process_group_ranks(mesh["shard"].get_group())
    batch = {r: sample_batch(make_dataset("mlp", 8, seed=r), range(8)) for r in members}
    sgd = lambda params: torch.optim.SGD(params, lr=0.1)  # noqa: E731
    # PyTorch as the oracle: one process, the group's two batches, the mean of their losses
    reference = build_model("mlp", seed=0)
    loss = sum(loss_fn("mlp")(reference(x), y) for x, y in batch.values()) / len(members)
    loss.backward()
    sgd(reference.parameters()).step()
    weights = {}
    for i, name in enumerate(names):  # alternately a mesh dimension and its process group: both are accepted
        group = mesh["shard"] if i % 2 == 0 else mesh["shard"].get_group()
        model = build_model("mlp", seed=0)
        strategy = make_strategy(name, model, Timeline(context.device()), group=group)
        optimizer = strategy.make_optimizer(sgd)
        x, y = batch[dist.get_rank()]
        strategy.start_step(0)
        with strategy.micro_batch(sync=True):
            loss_fn("mlp")(strategy.wrap()(x), y).backward()
        strategy.finish(0)
        strategy.step_optimizer(optimizer)
        strategy.unshard()
        strategy.close()
        weights[name] = (flat_weights(model) - flat_weights(reference)).abs().max().item()
    return {"members": members, "weights": weights, "reference": flat_weights(reference)}


@pytest.mark.slow
def test_every_strategy_on_a_group_synchronises_among_that_group_only():
    out = dpteach.launch(_one_step_per_strategy_on_a_group, 4, args=(STRATEGIES,), timeout=300, backend="gloo",
                         device="cpu", show_output=False)
    for r in out:
        assert r["weights"] == pytest.approx({name: 0.0 for name in STRATEGIES}, abs=1e-6), r["members"]
    # the two groups saw different data, so they really did not average with each other
    assert not torch.allclose(out[0]["reference"], out[2]["reference"])
    assert torch.equal(out[0]["reference"], out[1]["reference"])
