"""Bitwise reproducibility: ``deterministic`` against the fixed-order single-process reference."""
import pytest
import torch

from dpteach.experiments import bitwise_reproducibility
from dpteach.sync.deterministic import sum_in_rank_order


def test_pieces_are_added_left_to_right_in_rank_order():
    # float32 spacing near 1e8 is 8, so where the 1 is added decides whether it survives
    assert sum_in_rank_order(torch.tensor([[1e8], [-1e8], [1.0]])).item() == 1.0
    assert sum_in_rank_order(torch.tensor([[-1e8], [1.0], [1e8]])).item() == 0.0
    pieces = torch.randn(4, 1000)
    assert torch.equal(sum_in_rank_order(pieces), ((pieces[0] + pieces[1]) + pieces[2]) + pieces[3])


@pytest.mark.slow
@pytest.mark.parametrize("world, model, optimizer, accum", [(3, "mlp", "sgd", 2), (4, "cnn", "adam", 1),
                                                             (3, "transformer", "adam", 1)])
def test_deterministic_training_equals_the_fixed_order_reference_bit_for_bit(world, model, optimizer, accum):
    result = bitwise_reproducibility(world, model=model, steps=4, batch_per_rank=8, accum_steps=accum,
                                     optimizer=optimizer)
    rows = {(r["strategy"], r["reference"]): r for r in result["rows"]}
    exact = rows["deterministic", "fixed order"]
    assert exact["bitwise_equal"] and exact["differing"] == 0 and exact["max_abs_diff"] == 0.0
    for row in result["rows"]:
        assert row["replicas_identical"], row
        assert row["max_abs_diff"] <= result["tolerance"], row  # all of them are the same model, up to rounding
    # The global-batch reference adds in another order: close, but not the same bits.
    assert not rows["deterministic", "global batch"]["bitwise_equal"]
    assert rows["deterministic", "global batch"]["differing"] > 0


@pytest.mark.parametrize("options, named", [({"contrast": "int8"}, "contrast='int8'"),
                                            ({"contrast": "deterministic"}, "contrast='deterministic'"),
                                            ({"accum_steps": 0}, "accum_steps=0"),
                                            ({"model": "resnet"}, "resnet")])
def test_bad_options_are_refused_before_any_rank_starts(options, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        bitwise_reproducibility(2, **options)
