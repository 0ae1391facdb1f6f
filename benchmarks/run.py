"""Run the benchmarks the issues set bars for and store each result with its command and machine.

    python benchmarks/run.py            # all of them (a few minutes on 2 cores)
    python benchmarks/report.py         # the tables

Each result is measured in one run, its ratios between algorithms or strategies measured side by
side (interleaved), because on a shared or busy machine absolute times drift but ratios hold.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
RUNS = {
    "allreduce_w4_cpu.json": ["bench", "allreduce", "--world-size", "4", "--sizes", "4KiB,64KiB,1MiB,16MiB",
                              "--iters", "30", "--json"],
    "compare_w2_cpu.json": ["compare", "--world-size", "2", "--steps", "30", "--json"],
    "compare_w4_cpu.json": ["compare", "--world-size", "4", "--steps", "30", "--json"],
    "compare_w2_transformer_1gbe.json": ["compare", "--world-size", "2", "--model", "transformer", "--link", "1gbe",
                                         "--json"],
    "sharding_w4_adam_cpu.json": ["compare", "-w", "4", "--optimizer", "adam", "--strategies",
                                  "ddp,zero1,zero2,zero3,fsdp", "--json"],
    "sending_less_w4_1gbe.json": ["compare", "-w", "4", "--strategies", "ddp,powersgd,local_sgd,diloco", "--link", "1gbe",
                                  "--json"],
    "frontier_zeropp_w4_pcie_1gbe.json": ["compare", "-w", "4", "--link", "pcie/1gbe", "--strategies",
                                          "zero3,zeropp,hsdp", "--json"],
    "frontier_demo_streaming_w4_1gbe.json": ["compare", "-w", "4", "--link", "1gbe", "--strategies",
                                             "ddp,demo,diloco,streaming_diloco", "--json"],
    "critical_batch_mlp_w2.json": ["batch-size", "--batches", "32,64,128,256,512,1024,2048,4096", "--json"],
    "lr_rules_mlp_w2.json": ["batch-size", "--lr-rules", "--batches", "32,512,4096", "--json"],
    "checkpointing_cpu.json": ["batch-size", "--checkpointing", "--json"],
}
# Written by benchmarks/link_vs_shaped.py (root only: network namespaces and tc):
#     sudo .venv/bin/python benchmarks/link_vs_shaped.py
SHAPED = ("link_vs_shaped_1gbit_cpu.json", "link_vs_shaped_200mbit_cpu.json")


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{os.cpu_count()} CPU cores ({cpu}), {platform.system()}, Python {platform.python_version()}, "
            f"torch {torch.__version__}, no GPU" if not torch.cuda.is_available() else
            f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}")


def main(names=None) -> int:
    RESULTS.mkdir(exist_ok=True)
    for name, args in RUNS.items():
        if names and name not in names:
            continue
        out = subprocess.run([sys.executable, "-m", "dpteach.cli", *args], capture_output=True, text=True, check=True)
        record = {"command": "dpteach " + " ".join(args), "machine": machine(), "report": json.loads(out.stdout)}
        (RESULTS / name).write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
