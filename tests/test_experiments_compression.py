"""compression_tradeoff and compression_bytes on real worlds: drift per step, and bytes against the formula."""
import pytest

from dpteach.experiments import compression_bytes, compression_on_links, compression_tradeoff
from dpteach.experiments.compression import bucket_sizes, half_precision_range, wire_bytes_formula


@pytest.fixture(scope="module")
def result():
    return compression_tradeoff(2, steps=5, batch_per_rank=8)


@pytest.mark.slow  # more than 4 s on 2 cores: in `make test`, not `make test-fast`
def test_drift_per_step_and_equivalence(result):
    rows = {r["strategy"]: r for r in result["rows"]}
    assert list(rows) == ["bucketed", "fp16", "bf16", "int8", "int8_ef"]
    for row in rows.values():
        assert len(row["drift_per_step"]) == 5 and len(row["losses"]) == 5 and row["replicas_identical"]
    assert all(d <= result["tolerance"] for d in rows["bucketed"]["drift_per_step"])
    for name in ("fp16", "bf16", "int8", "int8_ef"):
        assert rows[name]["max_abs_diff_vs_single"] > result["tolerance"], name
    assert rows["int8_ef"]["max_abs_diff_vs_single"] < rows["int8"]["max_abs_diff_vs_single"]
    assert len(result["reference_losses"]) == 5


def test_bytes_counter_follows_the_formula(result):
    for row in result["rows"]:
        assert row["bytes_per_step"] == row["bytes_formula"] > 0
    rows = {r["strategy"]: r for r in result["rows"]}
    assert rows["fp16"]["bytes_vs_fp32"] == pytest.approx(0.5, abs=1e-3)
    assert rows["int8"]["bytes_vs_fp32"] < 0.3  # W=2: (W-1) x 1 byte against 2(W-1)/W x 4 bytes


def test_int8_savings_shrink_as_the_world_grows(result):
    sweep = compression_bytes((2, 3), known=result)
    by = {(r["world_size"], r["strategy"]): r for r in sweep["rows"]}
    assert all(r["measured"] == r["formula"] for r in sweep["rows"])
    assert by[(2, "int8")]["measured"] / by[(2, "bucketed")]["measured"] < \
        by[(3, "int8")]["measured"] / by[(3, "bucketed")]["measured"] < 1
    sizes = bucket_sizes("mlp")
    assert wire_bytes_formula("int8", 7, sizes) < wire_bytes_formula("bucketed", 7, sizes) \
        < wire_bytes_formula("int8", 8, sizes)  # (W-1) x 1 byte overtakes 2(W-1)/W x 4 bytes at W = 8


def test_unknown_strategies_are_refused():
    with pytest.raises(ValueError, match="strategies=.*is not allowed"):
        compression_tradeoff(2, strategies=("int4",))
    with pytest.raises(ValueError, match="strategies=.*is not allowed"):
        compression_bytes((2,), strategies=("zip",))


def test_fp16_loses_small_gradients_to_its_range_and_bf16_does_not(result):
    half = result["half_range"]
    assert half == half_precision_range("mlp", (2, 64))  # the same gradients, counted on the host
    by = {(r["world_size"], r["format"]): r for r in half["rows"]}
    for w in (2, 64):
        assert by[(w, "bf16")]["underflow"] == 0.0 <= by[(w, "fp16")]["underflow"]
        assert 0.0 <= by[(w, "fp16")]["subnormal"] <= 1.0
    # dividing by more ranks pushes more values below fp16's smallest normal number
    assert by[(64, "fp16")]["subnormal"] > by[(2, "fp16")]["subnormal"]
    assert by[(64, "fp16")]["underflow"] >= by[(2, "fp16")]["underflow"]


def test_on_two_links_the_arithmetic_is_the_same_and_only_time_differs():
    result = compression_on_links(2, model="mlp", links=("1gbe", {"name": "fast", "alpha_s": 0.0, "beta_s_per_byte": 0.0}),
                                  strategies=("bucketed", "fp16"), steps=3, batch_per_rank=8,
                                  backend="gloo", device="cpu")
    rows = {(r["strategy"], r["link"]): r for r in result["rows"]}
    assert set(rows) == {(s, link) for s in ("bucketed", "fp16") for link in ("1gbe", "fast")}
    for s in ("bucketed", "fp16"):
        assert rows[(s, "1gbe")]["losses"] == rows[(s, "fast")]["losses"]
        assert rows[(s, "fast")]["time_set_by"] == "machine"  # no machine beats a zero-second link
    # on 1 Gbit/s, float32's 4.4 MB per step take 35 ms on the wire: fp16 halves that
    assert rows[("bucketed", "1gbe")]["step_time_s"] >= 0.9 * 4.36e6 * 8e-9
    assert rows[("fp16", "1gbe")]["bytes_per_step"] == pytest.approx(rows[("bucketed", "1gbe")]["bytes_per_step"] / 2)
    # every run's timed steps are its rounds: the median and interval the lesson ranks the strategies by
    timed = 3 - min(2, 3 - 1)
    for row in rows.values():
        d = row["spread"]["step_s"]
        assert d["n"] == timed and d["low"] <= d["median"] <= d["high"]
    assert result["local_spread"]["n"] == timed
    # the link's wait is a sleep: float32 on 1 Gbit/s cannot step faster than its bytes take on the wire
    assert rows[("bucketed", "1gbe")]["spread"]["step_s"]["low"] >= 0.9 * 4.36e6 * 8e-9


def test_compression_on_links_needs_links():
    with pytest.raises(ValueError, match="links=\\[None\\] is not allowed"):
        compression_on_links(2, links=(None,))
