#!/usr/bin/env bash
# Every lesson on a GPU machine, top to bottom as a learner's Run All, in one command of under 10 minutes.
#
# Runs scripts/gpu_lessons.py with the python3 that already has a CUDA build of torch: each notebook in a
# fresh Jupyter kernel, every panel at its default (on one GPU: the GPU-sized model, emulated peers where a
# lesson offers them), all within a 530 s budget; writes REPORT_DIR/gpu_lessons_<gpu>.json and .md (time,
# model, the numbers behind each figure, the checks that held, the bars of the GPU-sized course).
# Jupyter's pieces come from the wheels in .whl/ when the machine lacks them (scripts/gpu_wheels.sh fetches
# them where PyPI is reachable; carry .whl to the GPU machine). scripts/gpu_check.sh is the other GPU
# command: every CUDA code path, with correctness checks.
#
# Usage: scripts/gpu_lessons.sh [REPORT_DIR]        (default: benchmarks/results)
#        BUDGET=400 LESSONS=04,12 scripts/gpu_lessons.sh
#        ALLOW_CPU=1 scripts/gpu_lessons.sh /tmp/report   (the same path on a machine without a GPU)
# Exit status: 0 when every lesson passed in time; 1 when one did not; 2 when no GPU is visible;
# 3 when Jupyter's pieces are missing and no wheels were carried.
set -uo pipefail
cd "$(dirname "$0")/.."
REPORT="${1:-benchmarks/results}"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

if [ "${ALLOW_CPU:-0}" != 1 ]; then  # ALLOW_CPU=1: rehearse the whole path on a machine without a GPU
  "$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU is visible to this torch'
print('torch', torch.__version__, '|', torch.cuda.device_count(), 'x', torch.cuda.get_device_name(0))" || exit 2
fi

if ! "$PY" -c "import nbclient, ipykernel, ipywidgets, jsonschema" 2>/dev/null; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/dpteach-site \
      .whl/*.whl || exit 3
    export PYTHONPATH="/tmp/dpteach-site:$PYTHONPATH" JUPYTER_PATH="/tmp/dpteach-site/share/jupyter"
  else
    echo "nbclient, ipykernel, ipywidgets or jsonschema is missing and .whl/ holds no wheels: run scripts/gpu_wheels.sh"
    exit 3
  fi
fi

# Lessons 04 and 12 first: the measured bars of the GPU-sized course are read from them.
timeout 570 "$PY" scripts/gpu_lessons.py --out "$REPORT" --budget "${BUDGET:-530}" --lessons "${LESSONS:-}" \
  --first "${FIRST:-04,12}"
