"""Bucket assignment rules and 8-bit quantisation, checked without any process group."""
import pytest
import torch

from dpteach.replica.buckets import MB, Bucket, assign_buckets, build_buckets
from dpteach.replica.models import build_model
from dpteach.sync.compressed import dequantize_int8, quantize_int8


def floats(*sizes):
    return [torch.empty(n) for n in sizes]  # float32: 4 bytes per element


def test_buckets_are_filled_in_reverse_parameter_order():
    params = floats(10, 20, 30, 40)
    buckets = assign_buckets(params, bucket_mb=1.0)
    assert buckets == [[3, 2, 1, 0]]  # all fit: one bucket, last parameter first


def test_a_bucket_closes_once_it_reaches_the_cap_and_the_first_is_smaller():
    quarter = MB // 4 // 4  # elements in 0.25 MB
    params = floats(quarter, quarter, quarter, quarter, quarter, quarter)
    # first bucket cap 0.25 MB -> one parameter; then 0.5 MB caps -> two parameters each
    assert assign_buckets(params, bucket_mb=0.5, first_bucket_mb=0.25) == [[5], [4, 3], [2, 1], [0]]
    # default first bucket = a quarter of the cap
    assert assign_buckets(params, bucket_mb=1.0)[0] == [5]


def test_the_parameter_that_crosses_the_cap_joins_the_bucket():
    big, tiny = MB // 4, 16
    params = floats(tiny, big, tiny, big)  # bias, weight, bias, weight (forward order)
    assert assign_buckets(params, bucket_mb=1.0, first_bucket_mb=1.0) == [[3], [2, 1], [0]]


def test_a_parameter_larger_than_the_cap_gets_a_bucket_of_its_own():
    params = floats(10, 4 * MB // 4, 10)
    assert assign_buckets(params, bucket_mb=1.0, first_bucket_mb=1.0) == [[2, 1], [0]]


def test_dtypes_are_never_mixed_in_a_bucket():
    params = [torch.empty(4), torch.empty(4, dtype=torch.float64), torch.empty(4)]
    buckets = assign_buckets(params, bucket_mb=1.0)
    assert buckets == [[2], [1], [0]]


@pytest.mark.parametrize("bad", [0, -1, "1", None, True])
def test_bad_bucket_sizes_are_refused(bad):
    with pytest.raises(ValueError, match="bucket_mb=.* is not allowed"):
        assign_buckets(floats(4), bucket_mb=bad)


def test_flat_buffer_views_round_trip_gradients():
    model = build_model("mlp")
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    originals = [p.grad.clone() for p in model.parameters()]
    buckets = build_buckets(model, bucket_mb=1.0)
    assert sorted(id(p) for b in buckets for p in b.params) == sorted(id(p) for p in model.parameters())
    for bucket in buckets:
        bucket.copy_in()
        assert bucket.buffer.numel() == sum(p.numel() for p in bucket.params)
        bucket.buffer.mul_(2)
        bucket.copy_out()
    for p, g in zip(model.parameters(), originals):
        assert torch.equal(p.grad, 2 * g)


@pytest.mark.parametrize("n, chunk", [(1, 4), (1000, 64), (4097, 1024), (10, 1024)])
def test_int8_error_is_at_most_half_a_step_per_element(n, chunk):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)) * 3
    q, scales = quantize_int8(x, chunk)
    assert q.dtype == torch.int8 and q.numel() == n and scales.numel() == -(-n // chunk)
    step = scales.repeat_interleave(chunk)[:n]
    assert torch.all((dequantize_int8(q, scales, chunk) - x).abs() <= step / 2 + 1e-7)


def test_all_zero_chunks_decode_to_zero():
    q, scales = quantize_int8(torch.zeros(10), 4)
    assert torch.equal(dequantize_int8(q, scales, 4), torch.zeros(10))


def test_error_feedback_keeps_the_running_sum_close():
    # sending g every step: with feedback the decoded sum tracks the true sum within one step
    g = torch.randn(256, generator=torch.Generator().manual_seed(0)) * 1e-3
    residual, sent_total = torch.zeros_like(g), torch.zeros_like(g)
    for _ in range(50):
        x = g + residual
        q, s = quantize_int8(x, 64)
        decoded = dequantize_int8(q, s, 64)
        residual = x - decoded
        sent_total += decoded
    assert (sent_total - 50 * g).abs().max() <= residual.abs().max() + 1e-6
