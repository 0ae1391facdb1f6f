"""The course's emulated link against a link the kernel shapes: the same comparison over a real, shaped cable
and on loopback with an emulated link of the same rate and latency; each strategy's step time side by side.

    sudo .venv/bin/python benchmarks/link_vs_shaped.py            # 1 Gbit/s and 200 Mbit/s (root: namespaces, tc)

Two ranks run ``dpteach compare`` in two network namespaces joined by a veth pair whose both ends ``tc`` shapes to
a rate (tbf; and a delay with netem where the kernel has it), then the same comparison runs on loopback with
``--link-alpha``/``--link-beta`` of that rate and of the cable's measured latency. The bar: every strategy within
25% of the shaped link's step time. The two runs cannot be interleaved (one of them is in other namespaces), so
``local``, which sends nothing, is the control: where it differs by more than 8% between the two runs, the
machine's load changed between them and the pair is measured again (up to four times in all). Writes
``results/link_vs_shaped_<rate>_cpu.json``. The test (``tests/test_link_shaped.py``) holds the two to what load
cannot change: the bytes, the arithmetic, and that neither link moves bytes faster than its rate.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))
from run import RESULTS, machine  # noqa: E402
from shaped_link import compare_emulated, compare_over_the_cable, one_way_latency, shape, two_hosts  # noqa: E402

STRATEGIES = ("local", "bucketed", "overlap", "ddp")
ARGUMENTS = ["--model", "transformer", "--steps", "12", "--batch", "32", "--strategies", ",".join(STRATEGIES)]
RATES = {"1gbit": 1_000_000_000, "200mbit": 200_000_000}
DELAY_US, BAR, CONTROL = 100, 0.25, 0.08


def measure(rate_bits: int) -> dict:
    with two_hosts() as hosts:
        with_delay = shape(hosts, rate_bits, DELAY_US)
        alpha, beta = one_way_latency(hosts), 8 / rate_bits
        for attempt in range(4):
            shaped = {r["strategy"]: r for r in compare_over_the_cable(hosts, ARGUMENTS)[0]["rows"]}
            emulated = {r["strategy"]: r for r in compare_emulated(ARGUMENTS, alpha, beta)["rows"]}
            control = emulated["local"]["step_time_s"] / shaped["local"]["step_time_s"]
            if abs(control - 1) <= CONTROL:
                break
            print(f"  attempt {attempt + 1}: local differs by {control:.2f}x between the runs; measuring again")
    rows = [{"strategy": n, "shaped_s": shaped[n]["step_time_s"], "emulated_s": emulated[n]["step_time_s"],
             "ratio": emulated[n]["step_time_s"] / shaped[n]["step_time_s"],
             "time_set_by": (emulated[n]["link_report"] or {}).get("time_set_by")} for n in STRATEGIES]
    return {"rate_bits": rate_bits, "alpha_s": alpha, "beta_s_per_byte": beta, "with_delay": with_delay,
            "attempts": attempt + 1, "control": control, "bar": BAR,
            "within_bar": all(abs(r["ratio"] - 1) <= BAR for r in rows), "rows": rows}


def main(names=None) -> int:
    if os.geteuid() != 0:
        print("needs root (network namespaces and tc)", file=sys.stderr)
        return 2
    for name, rate in RATES.items():
        if names and name not in names:
            continue
        report = measure(rate)
        for r in report["rows"]:
            print(f"{name} {r['strategy']}: shaped {r['shaped_s'] * 1e3:.1f} ms, emulated {r['emulated_s'] * 1e3:.1f} "
                  f"ms, {r['ratio']:.2f}x")
        record = {"command": f"benchmarks/link_vs_shaped.py {name} (as root)", "machine": machine(), "report": report}
        path = RESULTS / f"link_vs_shaped_{name}_cpu.json"
        path.with_suffix(".tmp").write_text(json.dumps(record, indent=2) + "\n")
        os.replace(path.with_suffix(".tmp"), path)
        print(f"wrote {path.name}: {'within' if report['within_bar'] else 'NOT within'} {BAR:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
