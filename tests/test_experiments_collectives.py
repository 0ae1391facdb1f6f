"""Lesson 02's experiments: torch's collectives, a traced all-reduce replayed step by step, the sweep."""
import pytest

from dpteach.experiments import allreduce_sweep, collective_basics, collective_trace
from dpteach.experiments.collectives import replay


def test_builtin_collectives_deliver_what_their_names_say():
    ops = collective_basics(world_size=2, numel=2)["ops"]
    assert [r["after"] for r in ops["broadcast"]] == [[0.0, 1.0], [0.0, 1.0]]
    assert [r["after"] for r in ops["scatter"]] == [[0.0, 1.0], [100.0, 101.0]]
    assert ops["gather"][0]["after"] == [0.0, 1.0, 10.0, 11.0] and ops["gather"][1]["after"] == []
    assert ops["reduce"][0]["after"] == [10.0, 12.0] and ops["reduce"][1]["after"] == []
    assert [r["after"] for r in ops["all_reduce"]] == [[10.0, 12.0], [10.0, 12.0]]


def test_ring_trace_replays_to_the_real_buffers_with_uneven_chunks():
    result = collective_trace(world_size=3, numel=7, algorithm="ring")
    assert result["replay_matches_run"]
    assert all(v == 0b111 for row in result["final"] for v in row)  # every rank counted exactly once
    assert result["chunks"] == [(0, 3), (3, 5), (5, 7)]
    assert result["messages_sent"] == [4, 4, 4]  # 2(W-1) each
    # every rank sends every chunk but one in each phase: 2 x (7 - its own chunk)
    assert sum(result["elements_sent"]) == 2 * (3 - 1) * 7
    assert len(result["frames"]) == 1 + 2 * (3 - 1)
    assert [f["phase"] for f in result["frames"][1:]] == ["reduce_scatter"] * 2 + ["all_gather"] * 2


def _t(phase, step, src, dst, start=0, stop=2):
    return {"phase": phase, "step": step, "src": src, "dst": dst, "start": start, "stop": stop,
            "elements": stop - start, "chunk": None}


def test_replay_adds_in_reduce_phases_and_copies_in_broadcast_phases():
    # a binomial tree on 4 ranks: reduce at distance 1 then 2, broadcast back
    transfers = [_t("reduce", 0, 1, 0), _t("reduce", 0, 3, 2), _t("reduce", 1, 2, 0),
                 _t("broadcast", 0, 0, 2), _t("broadcast", 1, 0, 1), _t("broadcast", 1, 2, 3)]
    frames = replay(4, 2, transfers)
    assert frames[1]["state"][0][0] == {0, 1} and frames[1]["state"][2][0] == {2, 3}
    assert frames[2]["state"][0][0] == {0, 1, 2, 3} and frames[2]["state"][1][0] == {1}
    assert all(cell == {0, 1, 2, 3} for row in frames[-1]["state"] for cell in row)
    # transfers of one step read the state from before the step
    frames = replay(2, 1, [_t("reduce_scatter", 0, 0, 1, 0, 1), _t("reduce_scatter", 0, 1, 0, 0, 1)])
    assert frames[1]["state"] == [[{0, 1}], [{0, 1}]]


def test_sweep_predicts_every_algorithm_from_one_ring_fit():
    result = allreduce_sweep(world_size=2, sizes=("4KiB", "1MiB"), algorithms=("ring", "tree", "naive"), iters=2)
    assert result["sizes"] == [4096, 1 << 20]
    assert set(result["measured"]) == {"ring", "tree", "naive"}
    assert set(result["predicted"]) == {"ring", "tree", "naive"}
    assert all(len(v) == 2 and all(t > 0 for t in v) for v in result["measured"].values())
    # at W=2 the tree has as many steps as the ring and sends more: the model never prefers it
    assert result["crossover_bytes"] is None and result["model_choice"] == ["ring", "ring"]
    assert all(t >= r for t, r in zip(result["predicted"]["tree"], result["predicted"]["ring"]))
    assert len(result["measured_winner"]) == 2
    # a winner is named only where its whole interval lies below the other's; otherwise None (within noise)
    for i, winner in enumerate(result["measured_winner"]):
        ring, tree = result["spreads"]["ring"][i], result["spreads"]["tree"][i]
        assert len(ring["samples"]) == len(tree["samples"]) == 2
        separated = ring["high"] < tree["low"] or tree["high"] < ring["low"]
        assert (winner is not None) == separated
        if winner is not None:
            assert result["spreads"][winner][i]["high"] < result["spreads"]["tree" if winner == "ring" else "ring"][i]["low"]
    assert all(w is None or w in result["measured"] for w in result["measured_fastest"])
    assert set(result["fits"]) == {"ring", "tree", "naive"}
    assert result["fits"]["ring"]["alpha_s"] == pytest.approx(result["fit"]["alpha_s"])


@pytest.mark.parametrize("kwargs, word", [({"algorithm": "butterfly"}, "algorithm"), ({"numel": 0}, "numel"),
                                          ({"world_size": 1}, "world_size")])
def test_bad_trace_arguments_fail_before_any_rank_starts(kwargs, word):
    with pytest.raises(ValueError, match=word):
        collective_trace(**kwargs)


def test_per_rank_counts_read_as_prose():
    from dpteach.widgets.collectives import per_rank
    assert per_rank([6, 6, 6, 6]) == "6 each"
    assert per_rank([3, 0, 3]) == "3, 0 and 3"
