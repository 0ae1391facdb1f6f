"""Hybrid sharding (lesson 14) on four real gloo ranks laid out as 2 nodes x 2 ranks: the course's hsdp and
torch's FSDP2 on the same 2-D mesh end at single-process training's weights, and what the kernel counts on
the replicate group's sockets is the all-reduce of a gradient shard - all that crosses the slow link."""
import pytest

from dpteach.experiments import compare
from dpteach.experiments.hybrid import hybrid_sharding
from dpteach.network import resolve_link
from dpteach.network.link import TwoLevelLink
from dpteach.network.two_level import crossing_share


@pytest.fixture(scope="module")
def result():
    return hybrid_sharding(world_size=4, link="pcie/1gbe", ranks_per_node=2, steps=4, model="mlp", timeout=240)


@pytest.mark.slow
def test_both_hybrid_strategies_end_at_the_weights_of_one_process(result):
    rows = {row["strategy"]: row for row in result["rows"]}
    assert set(rows) == {"ddp", "zero3", "fsdp", "hsdp", "hsdp_torch"}
    for name, row in rows.items():
        assert row["within_tolerance"], f"{name}: max |dtheta| = {row['max_abs_diff_vs_single']:.3g}"
    assert result["not_emulated"].keys() == {"fsdp", "hsdp_torch"}  # FSDP2's collectives pass no emulated link
    assert rows["fsdp"]["bytes_between_per_step"] == pytest.approx(rows["zero3"]["bytes_between_per_step"], rel=0.01)
    assert [rows[n]["timed_on_link"] for n in ("ddp", "zero3", "hsdp")] == [True] * 3


@pytest.mark.slow
def test_hsdp_sends_across_nodes_only_the_all_reduce_of_a_gradient_shard(result):
    rows = {row["strategy"]: row for row in result["rows"]}
    for name in ("hsdp", "hsdp_torch"):
        row = rows[name]
        expected = row["expected_between_per_step"]  # 2(R-1)/R x the shard's gradient bytes; R = 2
        assert row["bytes_between_per_step"] == expected                                   # Comm's account
        assert row["received_between_per_step"] == pytest.approx(expected, rel=0.05), name  # the sockets'
        assert row["received_inside_per_step"] == pytest.approx(row["expected_inside_gloo_per_step"], rel=0.05)
        assert row["between_share"] == pytest.approx(0.25)  # 1 of 4 shard-sized messages per step crosses
    # a flat ring over 0,1,2,3 crosses nodes on 2 of its 4 hops: a larger share, and more bytes, cross
    assert rows["ddp"]["between_share"] == pytest.approx(0.5)
    assert rows["ddp"]["bytes_between_per_step"] > 1.4 * rows["hsdp"]["bytes_between_per_step"]
    assert rows["zero3"]["between_share"] == pytest.approx(0.5)


def test_a_two_level_link_and_its_rings():
    link = resolve_link("nvlink/1gbe")
    assert isinstance(link, TwoLevelLink) and link.between.name == "1gbe" and link.beta_s_per_byte == link.between.beta_s_per_byte
    assert resolve_link(link.as_dict()).ranks_per_node == 2
    assert crossing_share([0, 1, 2, 3], 2) == 0.5 and crossing_share([0, 2], 2) == 1.0 and crossing_share([2, 3], 2) == 0


def test_bad_arguments_are_refused_before_any_process_starts(monkeypatch):
    monkeypatch.setattr(compare, "launch", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(ValueError, match="link='pcie/nope' is not allowed: a two-level link is 'INSIDE/BETWEEN'"):
        hybrid_sharding(4, link="pcie/nope")
    with pytest.raises(ValueError, match="link='1gbe' is not allowed"):  # one level only
        hybrid_sharding(4, link="1gbe")
    with pytest.raises(ValueError, match="world_size=6 is not allowed: it must be a multiple of ranks_per_node=4"):
        hybrid_sharding(6, ranks_per_node=4)
    with pytest.raises(ValueError, match="its nodes hold 2 ranks, not ranks_per_node=4"):
        hybrid_sharding(8, link=resolve_link("pcie/1gbe"), ranks_per_node=4)
    from dpteach.training.train import TrainConfig
    with pytest.raises(ValueError, match="world_size=3 is not allowed with hsdp on nodes of 2 ranks"):
        TrainConfig(strategy="hsdp", link=resolve_link("pcie/1gbe")).check(3)
