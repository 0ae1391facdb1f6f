#!/usr/bin/env bash
# Everything a machine with a GPU should check, in one command of under 10 minutes, with its report.
#
#   0. `dpteach doctor --no-smoke`: the GPUs as the course reads them (capability, native bf16, peer access)
#      and what each lesson will show on them;
#   1. `dpteach doctor --gpu`, once: every CUDA path one GPU allows - NCCL with one rank, gloo ranks
#      sharing the GPU, two and three NCCL ranks sharing it (correctness only), the benchmark, every
#      strategy trained with CUDA-event timelines, lesson 11's sharded strategies and lesson 12's
#      precisions, one rank standing for eight on an emulated link spent on a CUDA stream - as JSON
#      (limit: 7 minutes);
#   2. the tests marked `gpu` (one GPU) and `multigpu` (two or more: multi-rank NCCL on real GPUs),
#      except the one that would run step 1 a second time (limit: 2.5 minutes);
#   3. the report: REPORT_DIR/gpu_check_<gpu>.json and .md (scripts/gpu_report.py), and the raw outputs.
#
# It runs the course from this checkout with the python3 that already has a CUDA build of torch (no
# install step, so it also works on a machine that cannot reach a package index; ipywidgets and
# JupyterLab are not needed for these checks). Every lesson on the GPU, with its GPU-sized defaults, is
# the other command: scripts/gpu_lessons.sh.
#
# Usage: scripts/gpu_check.sh [REPORT_DIR]      (default: benchmarks/results)
#        PYTHON=/path/to/python scripts/gpu_check.sh
# Exit status: 0 when the check and the tests all passed; 2 when no GPU is visible.
set -uo pipefail
cd "$(dirname "$0")/.."
REPORT="${1:-benchmarks/results}"
PY="${PYTHON:-python3}"
RAW="$REPORT/gpu_check_raw"
mkdir -p "$RAW"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU is visible to this torch'
print('torch', torch.__version__, '| CUDA', torch.version.cuda, '|', torch.cuda.device_count(), 'x', torch.cuda.get_device_name(0))" \
  || exit 2

start=$(date +%s)
# What the course reads of these GPUs, and what each lesson will show on them (dpteach/ranks/gpus.py)
timeout 60 "$PY" -m dpteach doctor --no-smoke > "$RAW/doctor_here.txt" 2>&1; cat "$RAW/doctor_here.txt"
timeout 420 "$PY" -m dpteach doctor --gpu --json > "$RAW/doctor_gpu.json" 2> "$RAW/doctor_gpu.stderr"
doctor=$?
echo "dpteach doctor --gpu: exit $doctor after $(( $(date +%s) - start )) s"
[ "$doctor" = 0 ] || tail -40 "$RAW/doctor_gpu.stderr"

# Only the files that hold GPU tests: the others import JupyterLab, Playwright and more.
timeout 150 "$PY" -m pytest -q -p no:cacheprovider -rs -m "gpu or multigpu" \
  --deselect tests/test_device_checks.py::test_gpu_check_passes_on_cuda --junitxml "$RAW/pytest_gpu.xml" \
  tests/test_collectives.py tests/test_launcher.py tests/test_device_checks.py 2>&1 | tee "$RAW/pytest_gpu.txt"
tests=${PIPESTATUS[0]}
echo "pytest -m 'gpu or multigpu': exit $tests"

"$PY" scripts/gpu_report.py --doctor "$RAW/doctor_gpu.json" --junit "$RAW/pytest_gpu.xml" \
  --seconds "$(( $(date +%s) - start ))" --out "$REPORT"
report=$?
cat "$REPORT"/gpu_check_*.md 2>/dev/null | head -60
[ "$doctor" = 0 ] && [ "$tests" = 0 ] && [ "$report" = 0 ]
