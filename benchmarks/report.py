"""Turn the JSON results in benchmarks/results/ into the Markdown tables of benchmarks/README.md.

    python benchmarks/report.py > benchmarks/RESULTS.md

Every figure comes from a results file; every results file records the command that made it.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from dpteach.training.batch_rules import run_outcome

RESULTS = Path(__file__).resolve().parent / "results"


def allreduce_table(report: dict) -> list[str]:
    rows = {(r["algorithm"], r["bytes"]): r for r in report["rows"]}
    sizes = sorted({b for _, b in rows})
    algorithms = [a for a in ("builtin", "ring", "tree", "naive") if any((a, s) in rows for s in sizes)]
    out = ["| bytes | " + " | ".join(f"{a} (ms)" for a in algorithms) + " | ring / builtin | ring busbw (GB/s) |",
           "|---:|" + "---:|" * (len(algorithms) + 2)]
    for size in sizes:
        cells = [f"{rows[(a, size)]['time_s'] * 1e3:.2f}" for a in algorithms]
        ratio = rows[("ring", size)]["time_s"] / rows[("builtin", size)]["time_s"]
        out.append(f"| {size} | " + " | ".join(cells) + f" | **{ratio:.2f}** | {rows[('ring', size)]['busbw_GBps']:.3f} |")
    fit = report.get("fit")
    if fit:
        out += ["", f"Alpha-beta fit to the ring: alpha = {fit['alpha_s'] * 1e6:.0f} us, "
                    f"beta = {fit['beta_s_per_byte'] * 1e9:.2f} ns/byte ({fit['bandwidth_GBps']:.2f} GB/s), R^2 = {fit['r2']:.3f}."]
    return out


def compare_table(report: dict) -> list[str]:
    rows = {r["strategy"]: r for r in report["rows"]}
    out = ["| strategy | step (ms) | exposed comm (ms) | overhead (ms) | MB / step | final loss | max abs diff vs 1 process "
           "| replicas identical |", "|---|---:|---:|---:|---:|---:|---:|:---:|"]
    for r in report["rows"]:
        exposed = "-" if r["exposed_comm_s"] is None else f"{r['exposed_comm_s'] * 1e3:.1f}"
        overhead = "-" if r.get("overhead_s") is None else f"{r['overhead_s'] * 1e3:.1f}"
        out.append(f"| {r['strategy']} | {r['step_time_s'] * 1e3:.1f} | {exposed} | {overhead} | "
                   f"{r['bytes_per_step'] / 2**20:.2f} | {r['final_loss']:.4f} | {r['max_abs_diff_vs_single']:.1e} | "
                   f"{'yes' if r['replicas_identical'] else 'no'} |")
    out += ["", "Exposed communication: the time the ranks waited for it, measured where they waited; overhead: the "
                "rest of the step above `local` (packing, launching, compute slowed by communication)."
            if any(r.get("overhead_s") is not None for r in report["rows"]) else ""]
    if {"overlap", "ddp", "naive"} <= set(rows):
        step_ratio = rows["overlap"]["step_time_s"] / rows["ddp"]["step_time_s"]
        exposed_ratio = rows["overlap"]["exposed_comm_s"] / rows["naive"]["exposed_comm_s"]
        out += ["", f"overlap step time / ddp step time = **{step_ratio:.2f}**; "
                    f"overlap exposed communication / naive exposed communication = **{exposed_ratio:.2f}**."]
    return out


def sharding_lines(report: dict) -> list[str]:
    """The sharding bars: memory per rank and traffic per step against ddp's, measured in one run."""
    rows = {r["strategy"]: r for r in report["rows"]}
    ddp = rows["ddp"]
    out = ["", "| strategy | state per rank (MiB) | state / ddp | peak per rank (MiB) | bytes per step / ddp | "
               "max abs diff vs 1 process |", "|---|---:|---:|---:|---:|---:|"]
    for name, r in rows.items():
        out.append(f"| {name} | {r['state_bytes_per_rank'] / 2**20:.2f} | "
                   f"**{r['state_bytes_per_rank'] / ddp['state_bytes_per_rank']:.3f}** | "
                   f"{r['peak_bytes_per_rank'] / 2**20:.2f} | **{r['bytes_per_step'] / ddp['bytes_per_step']:.3f}** | "
                   f"{r['max_abs_diff_vs_single']:.1e} |")
    out.append(f"\nTolerance of one process's weights: {report['tolerance']:.0e}.")
    return out


def link_lines(report: dict) -> list[str]:
    """The emulated-link bars: never faster than the link; overlap hides part of it."""
    link, rows = report["link"], {r["strategy"]: r for r in report["rows"]}
    out = ["", f"Emulated link `{link['name']}`: alpha = {link['alpha_s'] * 1e6:.0f} us, "
               f"beta = {link['beta_s_per_byte'] * 1e9:.2f} ns/byte."]
    if {"bucketed", "overlap"} <= set(rows):
        bucketed = rows["bucketed"]
        wire = bucketed["bytes_per_step"] * link["beta_s_per_byte"]
        out.append(f"bucketed exposed communication / link time for its bytes = "
                   f"**{bucketed['exposed_comm_s'] / wire:.2f}**; overlap exposed / bucketed exposed = "
                   f"**{rows['overlap']['exposed_comm_s'] / bucketed['exposed_comm_s']:.2f}**.")
    set_by = [f"{r['strategy']}: {r['link_report']['time_set_by']}" for r in report["rows"] if r.get("link_report")]
    out.append("Communication time set by (link or this machine): " + ", ".join(set_by) + ".")
    return out


def shaped_table(report: dict) -> list[str]:
    delay = "netem" if report["with_delay"] else "the cable's own, measured"
    out = [f"Rate {report['rate_bits'] / 1e6:g} Mbit/s (tc tbf), delay {delay}; emulated alpha "
           f"{report['alpha_s'] * 1e6:.0f} us, beta {report['beta_s_per_byte'] * 1e9:.2f} ns/byte.", "",
           "| strategy | shaped step (ms) | emulated step (ms) | emulated / shaped |", "|---|---:|---:|---:|"]
    for r in report["rows"]:
        out.append(f"| {r['strategy']} | {r['shaped_s'] * 1e3:.1f} | {r['emulated_s'] * 1e3:.1f} | "
                   f"**{r['emulated_s'] / r['shaped_s']:.2f}** |")
    return out


def speed_tables(data: dict) -> list[str]:
    out = ["| exercise | median, grader's clock (s) | median, `dpteach grade` command (s) | runs (grader's clock, s) | scores |",
           "|---|---:|---:|---|---|"]
    for r in data["grading"]:
        out.append(f"| {r['exercise']} | **{r['median_grader_s']:.2f}** | **{r['median_cli_s']:.2f}** | "
                   f"{', '.join(f'{t:.2f}' for t in r['grader_s'])} | {', '.join(sorted(set(r['scores'])))} |")
    out += ["", "| client | notebook | wall time per run (s) | exit codes | stalls |", "|---|---|---|---|---:|"]
    for r in data["notebooks"]:
        out.append(f"| {r['client']} | {r['notebook']} | {', '.join(f'{t:.1f}' for t in r['wall_s'])} | "
                   f"{', '.join(map(str, r['exit_codes']))} | {len(r['stalls'])} |")
    return out


def lesson_times_tables(data: dict) -> list[str]:
    """benchmarks/lesson_times.py: each lesson's wall time per run, against the bar, and its check cells."""
    out = [f"{data['busy_processes']} busy process(es) beside the lessons; bar: every lesson within "
           f"**{data['bar_s']:.0f} s**; over it: **{', '.join(data['over_bar']) or 'none'}**.", "",
           "| lesson | wall time per run (s) | median (s) | runs with every check cell passing | slowest cells (s) |",
           "|---|---|---:|---:|---|"]
    for r in data["lessons"]:
        slow = "; ".join(", ".join(f"{c['cell']}: {c['seconds']:.1f}" for c in run["slowest_cells"][:2])
                         for run in r["runs"][:1])
        out.append(f"| {r['notebook']} | {', '.join(f'{t:.1f}' for t in r['wall_s'])} | **{r['median_wall_s']:.1f}** | "
                   f"{r['passed']}/{len(r['runs'])} | {slow} |")
    return out


def sending_less_lines(report: dict) -> list[str]:
    """Lesson 14's bars: bytes per step against ddp's and the time to the target loss, measured in one run."""
    rows = {r["strategy"]: r for r in report["rows"]}
    ddp = rows["ddp"]
    out = [f"\nTarget loss {report['target_loss']:.4f} ({report['target_rule']}).", "",
           "| strategy | bytes per step / ddp | counted from step | steps to target | time to target (s) |",
           "|---|---:|---:|---:|---:|"]
    for name, r in rows.items():
        seconds = "not reached" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.2f}"
        out.append(f"| {name} | **{r['bytes_per_step'] / ddp['bytes_per_step']:.3f}** | {r['bytes_counted_from_step']} | "
                   f"{r['steps_to_target'] or '-'} | **{seconds}** |")
    return out


def frontier_lines(report: dict) -> list[str]:
    """Lesson 16's bars: ZeRO++'s bytes across nodes against zero3's, counted and received on the sockets; DeMo's
    bytes against ddp's; streaming DiLoCo's largest step against DiLoCo's; every time to target with its interval."""
    rows = {r["strategy"]: r for r in report["rows"]}
    out = [""]
    if "zeropp" in rows and "zero3" in rows:
        z, z3 = rows["zeropp"], rows["zero3"]
        across = z["bytes_between_per_step"] / z3["bytes_between_per_step"]
        between = z["received_between_per_step"] / z["bytes_between_per_step"]
        inside = z["received_inside_per_step"] / z["bytes_inside_per_step"]
        out.append(f"zeropp across nodes / zero3's: **{across:.3f}** (bar: at most 0.35); received / counted on "
                   f"the sockets: across **{between:.3f}**, inside **{inside:.3f}** (bar: within 5%).")
    if "demo" in rows and "ddp" in rows:
        d, ddp = rows["demo"], rows["ddp"]
        share = ddp["bytes_per_step"] / d["bytes_per_step"]
        out.append(f"demo's bytes per step / ddp's: **1/{share:.0f}** (bar: at most 1/10), target reached at step "
                   f"{d['steps_to_target'] or 'never'}.")
    if "streaming_diloco" in rows and "diloco" in rows:
        ratio = rows["streaming_diloco"]["largest_step_bytes"] / rows["diloco"]["largest_step_bytes"]
        out.append(f"streaming_diloco's largest step / diloco's: **{ratio:.3f}** (bar: at most 0.25).")
    out += ["", "| strategy | steps to target | time to target (s), median and interval | rounds |",
            "|---|---:|---:|---:|"]
    for name, r in rows.items():
        spread = r.get("time_to_target_spread_s")
        told = "not reached" if not spread else f"{spread['median']:.2f} ({spread['low']:.2f}-{spread['high']:.2f})"
        out.append(f"| {name} | {r['steps_to_target'] or '-'} | {told} | {spread['n'] if spread else '-'} |")
    return out


def critical_batch_lines(report: dict) -> list[str]:
    """Lesson 15's bar: steps to the target at each global batch, the fit and the ranks' noise scale."""
    fit, noise = report["fit"], report["noise_scale"]
    predicted = dict(zip(fit["batches"], fit["predicted"])) if fit else {}
    out = [f"MLP on {report['world_size']} ranks, target loss {report['target_loss']} (running mean of "
           f"{report['window']} steps), SGD with momentum {report['momentum']}, best learning rate of the grid per batch.", "",
           "| global batch | micro x accum per rank | best lr | steps to target | fit predicts | off by | samples |",
           "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["rows"]:
        p = predicted.get(r["batch"])
        off = f"{(p - r['steps_to_target']) / r['steps_to_target']:+.0%}" if p and r["steps_to_target"] else "-"
        out.append(f"| {r['batch']} | {r['micro_batch']} x {r['accum_steps']} | {r['best_lr']} | "
                   f"{r['steps_to_target'] or 'not reached'} | {f'{p:.1f}' if p else '-'} | {off} | "
                   f"{r['samples_to_target'] or '-'} |")
    if fit:
        out.append(f"\nFit S = S_min (1 + B_noise / B): S_min **{fit['s_min']:.1f}**, B_noise **{fit['b_noise']:.0f}**, "
                   f"worst error **{fit['worst_error']:.0%}** (bar: 25%). ")
    out.append(f"B_simple from the ranks' own and all-reduced gradients ({noise['steps']} steps): "
               f"**{noise['b_simple']:.0f}**." if noise["b_simple"] else "No noise-scale estimate.")
    return out


def lr_rules_lines(report: dict) -> list[str]:
    """Lesson 15's bar: at the largest batch, linear scaling with warmup against the fixed rate."""
    out = [f"MLP on {report['world_size']} ranks, base lr {report['base_lr']} at B={report['base_batch']}, "
           f"warmup {report['warmup_steps']} steps, target loss {report['target_loss']}, at most {report['max_steps']} "
           "steps.", "", "| global batch | rule | warmup | lr | steps to target |", "|---:|---|---:|---:|---|"]
    for r in report["rows"]:
        out.append(f"| {r['batch']} | {r['rule']} | {r['warmup_steps']} | {r['lr']:.4g} | {run_outcome(r)} |")
    big = report["largest"]
    out.append(f"\nAt the largest batch ({big['batch']}) linear scaling with warmup took fewer steps than the fixed "
               f"rate: **{big['linear_warmup_beats_fixed']}**.")
    return out


def checkpointing_lines(report: dict) -> list[str]:
    """Lesson 15's bar: checkpointing every block, bytes kept for backward and the whole step's time."""
    out = [f"Micro-batch {report['batch']}, {report['threads']} thread(s), {report['repeats']} interleaved repeats "
           "(medians).", "", "| model | blocks | kept for backward | checkpointed | saved | step ratio | "
           "one more forward predicts |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in report["rows"]:
        out.append(f"| {r['model']} | {r['blocks']} | {r['saved_bytes']:,} | {r['checkpointed_saved_bytes']:,} | "
                   f"**{r['share_saved']:.0%}** | **{r['step_time_ratio']:.2f}x** | {r['predicted_ratio']:.2f}x |")
    return out


def main() -> int:
    for path in sorted(RESULTS.glob("*.json")):
        if path.name.startswith("gpu_check_"):  # scripts/gpu_check.sh writes its own Markdown beside it
            print(f"### `{path.name}`\n\nThe GPU check's report: [`{path.with_suffix('.md').name}`](results/"
                  f"{path.with_suffix('.md').name}).\n")
            continue
        data = json.loads(path.read_text())
        print(f"### `{path.name}`\n")
        print(f"Command: `{data['command']}`  ")
        print(f"Machine: {data['machine']}\n")
        if "grading" in data:
            print("\n".join(speed_tables(data)) + "\n")
            continue
        if "lessons" in data:  # benchmarks/lesson_times.py
            print("\n".join(lesson_times_tables(data)) + "\n")
            continue
        if "misjudged" in data:  # benchmarks/grader_reliability.py
            print("| style | full marks |\n|---|---:|")
            print("\n".join(f"| {name} | {row['full_marks']} of {row['gradings']} |" for name, row in data["styles"].items()))
            print(f"\nExercise {data['exercise']}: **{data['misjudged']} of {data['gradings']}** gradings of honest "
                  f"solutions misjudged (bar: none), in {data['seconds']} s.\n")
            continue
        if "steps_recorded" in data:  # benchmarks/diagnose_planted.py
            print("\n".join(f"- {key}: **{value}**" for key, value in data["summary"].items()) + "\n")
            continue
        report = data["report"]
        if "plain_step_s" in report:  # benchmarks/lone_rank.py
            print(f"{report['model']}, batch {report['batch_per_rank']}, {report['threads']} threads: median step of a "
                  f"lone rank / of a plain process = **{report['ratio']:.2f}** (bar: at most {report['bar']}); "
                  f"steps (ms), alternating: plain {', '.join(f'{t * 1e3:.1f}' for t in report['plain_step_s'])}; "
                  f"rank {', '.join(f'{t * 1e3:.1f}' for t in report['rank_step_s'])}.\n")
            continue
        if "step_time_ratio" in report.get("rows", [{}])[0]:
            table = checkpointing_lines(report)
        elif "noise_scale" in report:
            table = critical_batch_lines(report)
        elif "linear_warmup_beats_fixed" in report.get("largest", {}):
            table = lr_rules_lines(report)
        elif "rate_bits" in report:
            table = shaped_table(report)
        elif "strategy" in report["rows"][0]:
            table = compare_table(report) + (link_lines(report) if report.get("link") else []) + \
                (sharding_lines(report) if "zero1" in {r["strategy"] for r in report["rows"]} else []) + \
                (sending_less_lines(report) if "local_sgd" in {r["strategy"] for r in report["rows"]} else []) + \
                (frontier_lines(report) if {"zeropp", "demo"} & {r["strategy"] for r in report["rows"]} else [])
        else:
            table = allreduce_table(report)
        print("\n".join(table) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
