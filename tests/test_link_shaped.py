"""The emulated link against the kernel's own, held to what load cannot change.

Two ranks run ``dpteach compare`` in two network namespaces joined by a veth pair whose both ends the kernel
shapes with ``tc`` to 200 Mbit/s (``tests/shaped_link.py``); the same comparison then runs on this machine's
loopback with an emulated link of that rate and the cable's measured latency. How close the two step times come
is a measurement, and a busy machine moves it: that is the benchmark's (``benchmarks/link_vs_shaped.py``, 25%
per strategy, with a control that sends nothing). Here, for every strategy, what no load can change:

* both runs send the same bytes per step, and train to the same loss bit for bit (the link changes time, not
  arithmetic);
* neither link moves a step's bytes faster than its rate: the step takes at least the bytes' time on the wire,
  less what the token bucket's burst lets through at once (load only ever adds time).

Needs root, iproute2's ``ip`` and ``tc``; skips with the reason elsewhere, like the two-node test.
"""
import pytest

from shaped_link import BURST_BYTES, CannotMakeHosts, compare_emulated, compare_over_the_cable, one_way_latency, shape

STRATEGIES = ("local", "bucketed", "overlap", "ddp")
ARGUMENTS = ["--model", "transformer", "--steps", "6", "--batch", "32", "--strategies", ",".join(STRATEGIES)]
RATE_BITS = 200_000_000


@pytest.mark.slow
def test_the_emulated_and_the_shaped_link_send_the_same_bytes_and_neither_beats_its_rate(two_hosts):
    try:
        shape(two_hosts, RATE_BITS, delay_us=100)
    except CannotMakeHosts as exc:
        pytest.skip(str(exc))
    alpha = one_way_latency(two_hosts)
    shaped = {r["strategy"]: r for r in compare_over_the_cable(two_hosts, ARGUMENTS)[0]["rows"]}
    emulated = {r["strategy"]: r for r in compare_emulated(ARGUMENTS, alpha, 8 / RATE_BITS)["rows"]}
    for name in STRATEGIES:
        real, emu = shaped[name], emulated[name]
        assert real["bytes_per_step"] == emu["bytes_per_step"], (name, real["bytes_per_step"], emu["bytes_per_step"])
        assert real["final_loss"] == emu["final_loss"], (name, real["final_loss"], emu["final_loss"])
        wire_s = max(0, real["bytes_per_step"] - BURST_BYTES) * 8 / RATE_BITS
        for run, row in (("shaped", real), ("emulated", emu)):
            assert row["step_time_s"] >= wire_s, (
                f"{name} on the {run} link: a step of {row['step_time_s'] * 1e3:.1f} ms moved "
                f"{row['bytes_per_step']:.0f} bytes, which take {wire_s * 1e3:.1f} ms at {RATE_BITS / 1e6:g} Mbit/s")
    assert shaped["bucketed"]["bytes_per_step"] > 10 * BURST_BYTES  # the bound above is not a trivial one
