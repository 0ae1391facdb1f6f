"""Make the quiz figures that are drawn from a real run's trace (the items with a ``figure`` in quizzes/).

    python scripts/quiz_figures.py            # run each figure's run again, write its trace and picture
    python scripts/quiz_figures.py --draw     # only draw the pictures again from the traces already there

For each figure the run named in the item (``figure.run``: an experiment and its arguments) is started with
``trace=`` set to the item's trace file, so the trace is a real run's, whole; the picture is then drawn from
that file alone - the runs and steps ``figure.run.shown`` names, each rank's compute and communication - so
what the question asks about can be checked in the trace with Perfetto as well as in the picture.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a clone without installing

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import yaml  # noqa: E402

from dpteach import experiments  # noqa: E402
from dpteach.widgets.gantt import plot_gantt  # noqa: E402

BANK = HERE.parent / "quizzes"


def figures() -> list[dict]:
    """Every item's figure in the bank, with the item's id."""
    found = []
    for path in sorted(BANK.glob("*.yaml")):
        for item in yaml.safe_load(path.read_text())["items"]:
            if "figure" in item:
                found.append({**item["figure"], "id": item["id"]})
    return found


def spans_from_trace(path: Path) -> dict:
    """``{run: {rank: spans}}`` read back from a trace file: what the picture is drawn from."""
    runs: dict = {}
    for event in json.loads(path.read_text())["traceEvents"]:
        if event["ph"] != "X":
            continue
        args = event["args"]
        span = {**{k: v for k, v in args.items() if k != "run"}, "name": event["name"], "lane": event["cat"],
                "start": event["ts"] / 1e6, "end": (event["ts"] + event["dur"]) / 1e6}
        runs.setdefault(args["run"], {}).setdefault(event["pid"], []).append(span)
    return runs


def draw(figure: dict, into: Path = BANK / "figures") -> None:
    runs = spans_from_trace(BANK / figure["trace"])
    shown = figure["run"]["shown"]
    fig, axes = plt.subplots(len(shown["runs"]), 1, figsize=(10, 2.4 * len(shown["runs"]) + 0.4), squeeze=False)
    for ax, name in zip(axes[:, 0], shown["runs"]):
        steps = ", ".join(map(str, shown["steps"]))
        plot_gantt(runs[name], steps=set(shown["steps"]), ax=ax, title=f"{name}: step {steps}")
    fig.tight_layout()
    fig.savefig(into / Path(figure["image"]).name, dpi=90)
    plt.close(fig)
    print(f"{figure['id']}: drew {figure['image']} from {figure['trace']}")


def run(figure: dict) -> None:
    experiment = getattr(experiments, figure["run"]["experiment"])
    experiment(**figure["run"]["arguments"], trace=str(BANK / figure["trace"]))
    print(f"{figure['id']}: ran {figure['run']['experiment']}, wrote {figure['trace']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draw", action="store_true", help="only draw again, from the traces already written")
    parser.add_argument("--into", type=Path, default=BANK / "figures",
                        help="folder for the pictures (default: the bank's figures/)")
    args = parser.parse_args()
    done = set()
    for figure in figures():
        key = (figure["trace"], json.dumps(figure["run"]["arguments"], sort_keys=True))
        if not args.draw and key not in done:  # items that share a run share its trace
            run(figure)
            done.add(key)
        draw(figure, args.into)
    return 0


if __name__ == "__main__":
    sys.exit(main())
