"""What ``dpteach doctor --gpu`` (``run.py``) holds its report to: every check, by name, passed or not.

The report is plain data - per world, the collectives' comparisons, the training tables, lesson 11's
sharded strategies, lesson 12's precisions, the emulated peers - and each check below reads one number
of it and says in its name what it expected, so that a failure reads as a sentence in the report
(``scripts/gpu_report.py`` prints them). Kept apart from the code that runs the worlds, so that a wrong
result can be planted in a copy of a real report and must come out as exactly one failed check
(``tests/test_device_checks.py``).
"""
from __future__ import annotations

from ..sync import strategy_class

FULL = "full"  # a world whose scope is every check (the other scope runs the collectives only)
EXACT_TOLERANCE = 1e-5
EMULATED_W = 8  # one real rank standing for this many


def training_tables(world: dict) -> dict:
    """Every training table of one world, by name: compare, accumulation and one per other model."""
    return {"compare": world["compare"], "accumulation": world["accumulation"], **world.get("models", {})}


def all_checks(report: dict) -> list[tuple[str, bool]]:
    """Every check the report holds, as (name, passed). A world that could not form has none."""
    checks = []
    for world in report["worlds"]:
        if world.get("unavailable"):
            continue
        label, device = world["label"], world["device"]
        checks += [(f"{label}: {k}", ok) for k, ok in world["collectives"].items() if k != "device"]
        if "failure" in world:
            f = world["failure"]
            checks.append((f"{label}: rank 1's error came home while rank 0 waited ({f['seconds']:.1f} s)",
                           f["rank"] == 1 and f["reported"] and f["seconds"] < f["timeout"]))
        if world.get("scope", FULL) != FULL:
            continue
        checks.append((f"{label}: bench ran on {world['bench']['device']}", world["bench"]["device"] == device))
        for key, table in training_tables(world).items():
            checks.append((f"{label}: {key} ran on {table['device']}", table["device"] == device))
            for row in table["rows"]:
                name = f"{label}: {key} {row['strategy']}"
                if row["exact"]:
                    diff = row["max_abs_diff_vs_single"]
                    checks.append((f"{name} within {EXACT_TOLERANCE:g} of one process ({diff:.1e})",
                                   diff <= EXACT_TOLERANCE))
                strategy = strategy_class(row["strategy"])
                if strategy.lockstep and strategy.communicates:  # every replica takes the same averaged step
                    checks.append((f"{name} replicas identical", row["replicas_identical"]))
        bitwise = world["bitwise"]
        row = next(r for r in bitwise["rows"] if (r["strategy"], r["reference"]) == ("deterministic", "fixed order"))
        checks.append((f"{label}: deterministic {bitwise['model']} ran on {bitwise['device']}",
                       bitwise["device"] == device))
        checks.append((f"{label}: deterministic {bitwise['model']} equals the fixed-order reference bit for bit "
                       f"({row['differing']} weights differ)", row["bitwise_equal"]))
        checks += _precision_checks(label, device, world.get("precision"))
        checks += _sharded_checks(label, device, world.get("sharded"))
        checks += _emulated_checks(label, device, world.get("emulated_peers"))
    return checks


def _precision_checks(label: str, device: str, table: dict | None) -> list:
    """Lesson 12 on this device: fp32 exact, the same held state in every precision, a small 16-bit drift."""
    if table is None:
        return []
    rows = {r["precision"]: r for r in table["rows"]}
    checks = [(f"{label}: precision ran on {table['device']}", table["device"] == device),
              (f"{label}: precision fp32 within {table['tolerance']:g} of one process ({table['fp32_vs_single']:.1e})",
               table["fp32_vs_single"] <= table["tolerance"]),
              (f"{label}: precision state the same in fp32, bf16 and fp16",
               len({r["state_bytes"] for r in rows.values()}) == 1)]
    for name in ("bf16", "fp16"):
        drift = rows[name]["relative_drift"]
        checks.append((f"{label}: precision {name} drifts a little from fp32 ({drift:.2%})", 0 < drift < 0.5))
        checks.append((f"{label}: precision {name} replicas identical", rows[name]["replicas_identical"]))
    return checks


def _sharded_checks(label: str, device: str, table: dict | None) -> list:
    """Lesson 11 on this device: every stage exact against one process, and holding less than ddp in order."""
    if table is None:
        return []
    rows = {r["strategy"]: r for r in table["rows"]}
    checks = [(f"{label}: sharded ran on {table['device']}", table["device"] == device)]
    for name, r in rows.items():
        checks.append((f"{label}: sharded {name} within {table['tolerance']:g} of one process "
                       f"({r['max_abs_diff_vs_single']:.1e})", r["max_abs_diff_vs_single"] <= table["tolerance"]))
    held = [rows[s]["state_bytes_per_rank"] for s in ("ddp", "zero1", "zero2", "zero3")]
    checks.append((f"{label}: sharded state per rank falls from ddp through zero1, zero2, zero3 "
                   f"({', '.join(f'{h / held[0]:.2f}' for h in held)})", held == sorted(held, reverse=True)))
    checks.append((f"{label}: sharded fsdp holds what zero3 holds, within 5%",
                   abs(rows["fsdp"]["state_bytes_per_rank"] / rows["zero3"]["state_bytes_per_rank"] - 1) < 0.05))
    return checks


def _emulated_checks(label: str, device: str, table: dict | None) -> list:
    """One rank standing for 8 on this device: the link, not the machine, set every message's time, and
    naive waited for all of it."""
    if table is None:
        return []
    rows = {r["strategy"]: r for r in table["rows"]}
    naive = rows["naive"]
    checks = [(f"{label}: emulated peers ran on {table['device']}, 1 rank for {table['world_size']}",
               table["device"] == device and table["real_ranks"] == 1 and table["world_size"] == EMULATED_W)]
    for name in ("naive", "overlap"):
        report = rows[name]["link_report"]
        checks.append((f"{label}: emulated peers {name}: the link set the time ({report['time_set_by']})",
                       report["time_set_by"] == "link"))
        error = report.get("emulation_error") or 0.0
        checks.append((f"{label}: emulated peers {name}: the link's time kept to within 10% ({error:.1%})",
                       error <= 0.10))
    checks.append((f"{label}: emulated peers naive waited for the whole link time "
                   f"({naive['exposed_comm_s'] * 1e3:.1f} of {table['link_seconds']['naive'] * 1e3:.1f} ms)",
                   naive["exposed_comm_s"] >= 0.9 * table["link_seconds"]["naive"]))
    return checks
