"""input_pipeline on a real 2-rank world: a sleeping loader, workers, set_epoch, and clean exits."""
import pytest

from dpteach.experiments import input_pipeline
from dpteach.experiments.input_pipeline import SlowDecodeDataset, ThreadPrefetcher, check_loader_config


@pytest.fixture(scope="module")
def result():
    return input_pipeline(2, steps=6, decode_ms=1.0, batch_per_rank=8)


def test_every_configuration_measured(result):
    assert [r["config"]["num_workers"] for r in result["rows"]] == [0, 0, 2, 2, 2]
    assert result["steps_per_epoch"] == 3 and result["epochs"] == 2
    for row in result["rows"]:
        assert len(row["waits_rank0"]) == len(row["computes_rank0"]) == 6
        assert 0.0 <= row["idle_fraction"] <= 1.0 and row["median_compute_s"] > 0
        assert row["children_left"] == 0  # no DataLoader worker outlived its epoch
        assert row["shards_disjoint"]
        assert set(result["spans"][row["name"]]) == {0, 1}


def test_synchronous_loading_pays_the_decode_time_every_step(result):
    sync = result["rows"][0]
    assert sync["decode_per_batch_s"] == pytest.approx(8 * 1e-3)
    assert min(sync["waits_rank0"]) >= sync["decode_per_batch_s"]  # sleep guarantees a lower bound

def test_each_loader_keeps_its_steady_waits_as_rounds(result):
    for row in result["rows"]:
        d = row["wait_spread"]
        assert d["n"] == 6 - 2  # each epoch's first batch left out: the workers' start-up is not a steady wait
        assert d["low"] <= d["median"] <= d["high"]
    sync = result["rows"][0]["wait_spread"]  # the mean over ranks of sleeps of the decode time: never below it
    assert sync["low"] >= result["rows"][0]["decode_per_batch_s"]


def test_forgotten_set_epoch_repeats_the_order(result):
    assert [r["epoch_orders_repeat"] for r in result["rows"]] == [False, False, False, False, True]


def test_pin_memory_only_with_cuda(result):
    assert result["rows"][3]["pin_memory_effective"] == (result["device"] == "cuda")


def test_thread_prefetcher_yields_everything_in_order_and_passes_errors_on():
    dataset = SlowDecodeDataset("mlp", 5, decode_ms=0.0)
    assert [item[2] for item in ThreadPrefetcher(iter(dataset), depth=2)] == [0, 1, 2, 3, 4]

    def broken():
        yield 1
        raise RuntimeError("disk gone")
    prefetcher = ThreadPrefetcher(broken(), depth=1)
    assert next(prefetcher) == 1
    with pytest.raises(RuntimeError, match="disk gone"):
        next(prefetcher)
    prefetcher.close()


def test_bad_loader_configurations_are_refused():
    with pytest.raises(ValueError, match="prefetch_factor=2 with num_workers=0 is not allowed"):
        check_loader_config({"num_workers": 0, "prefetch_factor": 2})
    with pytest.raises(ValueError, match="num_workers=-1 is not allowed"):
        check_loader_config({"num_workers": -1})
    with pytest.raises(ValueError, match="is not allowed: use a dict"):
        check_loader_config({"workers": 2})
    with pytest.raises(ValueError, match="decode_ms=-1 is not allowed"):
        input_pipeline(2, decode_ms=-1)
