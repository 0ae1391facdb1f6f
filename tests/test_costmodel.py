"""Tests for dpteach.network.costmodel: formulas at hand-computed points, fitting, crossover, choice."""
import math

import numpy as np
import pytest

from dpteach.network import costmodel
from dpteach.network import Link

LINK = Link("test", alpha_s=1e-5, beta_s_per_byte=1e-9)          # 10 us per message, 1 GB/s
LINK_G = Link("test", alpha_s=1e-5, beta_s_per_byte=1e-9, gamma_s_per_byte=2e-10)
N = 1_000_000
approx = pytest.approx


# ---------------------------------------------------------------- the link

def test_link_from_bandwidth():
    link = Link.from_bandwidth("test", 1e-5, 25.0, reduce_GBps=100.0)
    assert link.alpha_s == 1e-5
    assert link.beta_s_per_byte == approx(1 / 25e9)
    assert link.gamma_s_per_byte == approx(1 / 100e9)
    assert link.bandwidth_GBps == approx(25.0)
    assert Link.from_bandwidth("test", 0.0, 1.0).gamma_s_per_byte == 0.0
    assert Link("test", 1e-5, 0.0).bandwidth_GBps == math.inf
    assert Link.from_bandwidth("test", 1e-5, math.inf).beta_s_per_byte == 0.0


# ---------------------------------------------------------------- formulas, p = 4, n = 1e6

def test_ring_formula():
    # 2(p-1)*alpha = 6 * 1e-5 = 6e-5 ; 2(p-1)/p * n * beta = 1.5 * 1e6 * 1e-9 = 1.5e-3
    assert costmodel.ring_allreduce_time(N, 4, LINK) == approx(1.56e-3)
    # + (p-1)/p * n * gamma = 0.75 * 1e6 * 2e-10 = 1.5e-4
    assert costmodel.ring_allreduce_time(N, 4, LINK_G) == approx(1.71e-3)


def test_tree_formula():
    # ceil(log2 4) = 2: 2*2*(1e-5 + 1e6*1e-9) = 4 * 1.01e-3 = 4.04e-3
    assert costmodel.tree_allreduce_time(N, 4, LINK) == approx(4.04e-3)
    # + 2 * 1e6 * 2e-10 = 4e-4
    assert costmodel.tree_allreduce_time(N, 4, LINK_G) == approx(4.44e-3)
    # p = 5: ceil(log2 5) = 3: 6 * 1.01e-3 = 6.06e-3
    assert costmodel.tree_allreduce_time(N, 5, LINK) == approx(6.06e-3)


def test_naive_formula():
    # 2(p-1)*(alpha + n*beta) = 6 * 1.01e-3 = 6.06e-3 ; + (p-1)*n*gamma = 3 * 2e-4 = 6e-4
    assert costmodel.naive_allreduce_time(N, 4, LINK) == approx(6.06e-3)
    assert costmodel.naive_allreduce_time(N, 4, LINK_G) == approx(6.66e-3)


def test_halving_doubling_formula():
    # 2*log2(4)*alpha = 4e-5 ; 2*3/4 * 1e6 * 1e-9 = 1.5e-3 -> 1.54e-3 ; + 0.75*1e6*2e-10 = 1.5e-4
    assert costmodel.halving_doubling_allreduce_time(N, 4, LINK) == approx(1.54e-3)
    assert costmodel.halving_doubling_allreduce_time(N, 4, LINK_G) == approx(1.69e-3)
    # p = 6 runs on q = 4 plus one step in and one out:
    # (2*2 + 2) * 1e-5 = 6e-5 ; (1.5 + 2) * 1e6 * 1e-9 = 3.5e-3 -> 3.56e-3
    assert costmodel.halving_doubling_allreduce_time(N, 6, LINK) == approx(3.56e-3)


def test_predict_dispatches_by_name():
    for name, fn in [("ring", costmodel.ring_allreduce_time), ("tree", costmodel.tree_allreduce_time),
                     ("naive", costmodel.naive_allreduce_time),
                     ("halving_doubling", costmodel.halving_doubling_allreduce_time)]:
        assert costmodel.predict(name, N, 8, LINK_G) == fn(N, 8, LINK_G)
    assert set(costmodel.ALGORITHMS) == {"ring", "tree", "naive", "halving_doubling"}


@pytest.mark.parametrize("algorithm", costmodel.ALGORITHMS)
def test_single_rank_costs_nothing(algorithm):
    assert costmodel.predict(algorithm, N, 1, LINK_G) == 0.0


@pytest.mark.parametrize("algorithm", costmodel.ALGORITHMS)
def test_empty_message_costs_only_latency(algorithm):
    assert costmodel.predict(algorithm, 0, 8, LINK_G) > 0
    assert costmodel.predict(algorithm, 0, 8, Link("test", 0.0, 1e-9)) == 0.0


def test_float_whole_number_of_bytes_is_accepted():
    assert costmodel.predict("ring", 1e6, 4, LINK) == costmodel.predict("ring", N, 4, LINK)


# ---------------------------------------------------------------- fitting

def _samples(algorithm, link, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for p in (2, 4, 8):
        for n in (1 << k for k in range(10, 27, 2)):
            t = costmodel.predict(algorithm, n, p, link)
            out.append((n, p, t * (1 + noise * rng.standard_normal())))
    return out


@pytest.mark.parametrize("algorithm", costmodel.ALGORITHMS)
def test_fit_recovers_exact_parameters(algorithm):
    truth = Link("truth", alpha_s=2e-5, beta_s_per_byte=5e-10)
    fit = costmodel.fit_alpha_beta(_samples(algorithm, truth), algorithm=algorithm)
    assert isinstance(fit, costmodel.Fit)
    assert fit.algorithm == algorithm
    assert fit.link.alpha_s == approx(2e-5, rel=1e-9)
    assert fit.link.beta_s_per_byte == approx(5e-10, rel=1e-9)
    assert fit.link.gamma_s_per_byte == 0.0
    assert fit.r2 == approx(1.0)
    assert len(fit.residuals) == len(_samples(algorithm, truth))
    assert max(abs(r) for r in fit.residuals) < 1e-12


def test_fit_from_noisy_samples_is_close():
    truth = Link("truth", alpha_s=2e-5, beta_s_per_byte=5e-10)
    fit = costmodel.fit_alpha_beta(_samples("ring", truth, noise=0.02, seed=1234))
    assert fit.link.alpha_s == approx(2e-5, rel=0.15)
    assert fit.link.beta_s_per_byte == approx(5e-10, rel=0.05)
    assert 0.99 < fit.r2 < 1.0


def test_fit_folds_gamma_into_beta():
    # every algorithm reduces half the bytes it sends, so the fitted beta is beta + gamma/2
    truth = Link("truth", alpha_s=2e-5, beta_s_per_byte=5e-10, gamma_s_per_byte=2e-10)
    fit = costmodel.fit_alpha_beta(_samples("tree", truth), algorithm="tree")
    assert fit.link.alpha_s == approx(2e-5, rel=1e-9)
    assert fit.link.beta_s_per_byte == approx(6e-10, rel=1e-9)


def test_fit_clamps_negative_latency_to_zero():
    # times = 1e-9 * B - 1e-5 * A would need a negative alpha; the fit fixes alpha = 0 instead
    samples = []
    for n in (1e6, 2e6, 4e6):
        a, b, _ = costmodel._coefficients("ring", n, 4)
        samples.append((n, 4, 1e-9 * b - 1e-5 * a))
    fit = costmodel.fit_alpha_beta(samples)
    b_col = np.array([costmodel._coefficients("ring", n, 4)[1] for n, _, _ in samples])
    t = np.array([s[2] for s in samples])
    assert fit.link.alpha_s == 0.0
    assert fit.link.beta_s_per_byte == approx(float(b_col @ t / (b_col @ b_col)))


# ---------------------------------------------------------------- crossover and choice

def test_crossover_tree_ring_at_p8():
    # tree: 6*alpha + 6*n*beta ; ring: 14*alpha + 1.75*n*beta -> n* = 8e-5 / 4.25e-9 ~ 18823.5 B
    n_star = costmodel.crossover_bytes(8, LINK)
    assert n_star == approx(8e-5 / 4.25e-9)
    tree = lambda n: costmodel.tree_allreduce_time(n, 8, LINK)  # noqa: E731
    ring = lambda n: costmodel.ring_allreduce_time(n, 8, LINK)  # noqa: E731
    lo, hi = math.floor(n_star / 2), math.ceil(2 * n_star)
    assert tree(lo) < ring(lo) and tree(hi) > ring(hi)
    # at the crossover the two predictions are equal (evaluate the lines directly: n* is fractional)
    assert 6e-5 + 6 * n_star * 1e-9 == approx(14e-5 + 1.75 * n_star * 1e-9)


def test_crossover_equal_predictions_with_gamma():
    n_star = costmodel.crossover_bytes(16, LINK_G, a="tree", b="ring")
    n_floor = math.floor(n_star)
    t_tree = costmodel.tree_allreduce_time(n_floor, 16, LINK_G)
    t_ring = costmodel.ring_allreduce_time(n_floor, 16, LINK_G)
    assert t_tree == approx(t_ring, rel=1e-4)


def test_crossover_none_when_one_always_wins():
    assert costmodel.crossover_bytes(2, LINK) is None          # tree has as many steps as ring
    assert costmodel.crossover_bytes(3, LINK) is None          # ceil(log2 3) = 2 = p - 1
    assert costmodel.crossover_bytes(8, Link("test", 1e-5, 0.0)) is None   # tree always wins
    assert costmodel.crossover_bytes(8, LINK, a="halving_doubling", b="ring") is None
    assert costmodel.crossover_bytes(1, LINK) is None
    # ring wins only above n*: no size *below* which it is faster; swapped, n* is returned
    assert costmodel.crossover_bytes(8, LINK, a="ring", b="tree") is None


def test_choose_algorithm_tree_small_ring_large():
    small = costmodel.choose_algorithm(8, 8, LINK)
    large = costmodel.choose_algorithm(100_000_000, 8, LINK)
    assert small.algorithm == "tree" and large.algorithm == "ring"
    assert set(small.times) == {"ring", "tree"}
    assert small.times["tree"] == costmodel.tree_allreduce_time(8, 8, LINK)


def test_choose_algorithm_ties_and_halving_doubling():
    # p = 1: every time is 0, so the first candidate wins
    assert costmodel.choose_algorithm(N, 1, LINK, candidates=("tree", "ring")).algorithm == "tree"
    assert costmodel.choose_algorithm(N, 8, LINK, candidates=costmodel.ALGORITHMS).algorithm == "halving_doubling"
    not_pow2 = costmodel.choose_algorithm(N, 6, LINK, candidates=costmodel.ALGORITHMS)
    assert "halving_doubling" not in not_pow2.times


def test_bandwidth_helpers():
    assert costmodel.busbw_factor(8) == approx(1.75)   # 2 * 7 / 8
    assert costmodel.busbw_factor(1) == 0.0
    assert costmodel.algbw(1e6, 1e-3) == approx(1e9)


# ---------------------------------------------------------------- bad arguments

@pytest.mark.parametrize("call, name", [
    (lambda: costmodel.predict("ring", -1, 4, LINK), "n="),
    (lambda: costmodel.predict("ring", 0.5, 4, LINK), "n="),
    (lambda: costmodel.predict("ring", "1e6", 4, LINK), "n="),
    (lambda: costmodel.predict("ring", math.inf, 4, LINK), "n="),
    (lambda: costmodel.predict("ring", True, 4, LINK), "n="),
    (lambda: costmodel.ring_allreduce_time(N, 0, LINK), "p="),
    (lambda: costmodel.tree_allreduce_time(N, 2.0, LINK), "p="),
    (lambda: costmodel.naive_allreduce_time(N, True, LINK), "p="),
    (lambda: costmodel.halving_doubling_allreduce_time(N, 4, (1e-5, 1e-9)), "link="),
    (lambda: costmodel.predict("butterfly", N, 4, LINK), "algorithm="),
    (lambda: Link("bad", -1.0, 1e-9), "alpha_s="),
    (lambda: Link("bad", 1e-5, math.nan), "beta_s_per_byte="),
    (lambda: Link("bad", 1e-5, 1e-9, gamma_s_per_byte=-1.0), "gamma_s_per_byte="),
    (lambda: Link.from_bandwidth("bad", -1.0, 1.0), "alpha_s="),
    (lambda: Link.from_bandwidth("bad", 1e-5, 0), "bandwidth_GBps="),
    (lambda: Link.from_bandwidth("bad", 1e-5, 1.0, reduce_GBps=0), "reduce_GBps="),
    (lambda: costmodel.collective_time("broadcast", N, 4, LINK), "kind="),
    (lambda: costmodel.fit_alpha_beta([(N, 4, 1e-3)]), "samples="),
    (lambda: costmodel.fit_alpha_beta([(N, 4, 1e-3), (N, 4, 1.1e-3)]), "samples="),
    (lambda: costmodel.fit_alpha_beta([(N, 1, 0.0), (2 * N, 1, 0.0)]), "samples="),
    (lambda: costmodel.fit_alpha_beta([(N, 4)]), "samples[0]="),
    (lambda: costmodel.fit_alpha_beta([(N, 4, 1e-3), (N, 4, -1.0)]), "samples[1] seconds="),
    (lambda: costmodel.fit_alpha_beta([(N, 4, 1e-3), (-5, 4, 1.0)]), "samples[1] n_bytes="),
    (lambda: costmodel.fit_alpha_beta(5), "samples="),
    (lambda: costmodel.fit_alpha_beta(_samples("ring", LINK), algorithm="x"), "algorithm="),
    (lambda: costmodel.crossover_bytes(0, LINK), "p="),
    (lambda: costmodel.crossover_bytes(8, LINK, a="x"), "a="),
    (lambda: costmodel.crossover_bytes(8, LINK, b="y"), "b="),
    (lambda: costmodel.choose_algorithm(N, 8, LINK, candidates=()), "candidates="),
    (lambda: costmodel.choose_algorithm(N, 8, LINK, candidates=("ring", "bogus")), "candidates="),
    (lambda: costmodel.choose_algorithm(N, 6, LINK, candidates=("halving_doubling",)), "candidates="),
    (lambda: costmodel.choose_algorithm(-1, 8, LINK), "n="),
    (lambda: costmodel.busbw_factor(0), "p="),
    (lambda: costmodel.algbw(N, 0), "seconds="),
    (lambda: costmodel.algbw(-1, 1.0), "n="),
])
def test_bad_arguments_raise_value_error_naming_them(call, name):
    with pytest.raises(ValueError) as info:
        call()
    assert str(info.value).startswith(name), str(info.value)
    assert "not allowed" in str(info.value)
