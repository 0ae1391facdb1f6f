#!/usr/bin/env bash
# Everything a machine with a GPU should check, in one command, with the reports kept.
#
#   1. `dpteach doctor --gpu`: every CUDA path one GPU allows (NCCL with one rank, gloo ranks sharing
#      the GPU, the benchmark, every strategy trained with CUDA-event timelines), as JSON and as text;
#   2. the tests marked `gpu` (one GPU) and `multigpu` (two or more: multi-rank NCCL).
#
# It runs the course from this checkout with the python3 that already has a CUDA build of torch (no
# install step, so it also works on a machine that cannot reach a package index; ipywidgets and
# JupyterLab are not needed for these checks).
#
# Usage: scripts/gpu_check.sh [REPORT_DIR]      (default: $OUT if set, else ./gpu-report)
#        PYTHON=/path/to/python scripts/gpu_check.sh
# Exit status: 0 when the check and the tests all passed.
set -uo pipefail
cd "$(dirname "$0")/.."
REPORT="${1:-${OUT:-gpu-report}}"
PY="${PYTHON:-python3}"
mkdir -p "$REPORT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU is visible to this torch'
print('torch', torch.__version__, '| CUDA', torch.version.cuda, '|', torch.cuda.device_count(), 'x', torch.cuda.get_device_name(0))" \
  || exit 2

start=$(date +%s)
timeout 420 "$PY" -m dpteach doctor --gpu --json > "$REPORT/doctor_gpu.json" 2> "$REPORT/doctor_gpu.stderr"
doctor=$?
echo "dpteach doctor --gpu: exit $doctor after $(( $(date +%s) - start )) s (report: $REPORT/doctor_gpu.json)"
"$PY" - "$REPORT/doctor_gpu.json" <<'EOF' | tee "$REPORT/doctor_gpu.txt"
import json, sys
from dpteach.commands.doctor import _print_device_report
try:
    report = json.load(open(sys.argv[1]))
except ValueError:
    sys.exit("no report: see doctor_gpu.stderr")
_print_device_report(report)
EOF
[ "$doctor" = 0 ] || tail -40 "$REPORT/doctor_gpu.stderr"

# Only the files that hold GPU tests: the others import JupyterLab, Playwright and more.
timeout 420 "$PY" -m pytest -q -p no:cacheprovider -rs -m "gpu or multigpu" \
  tests/test_collectives.py tests/test_launcher.py tests/test_device_checks.py 2>&1 | tee "$REPORT/pytest_gpu.txt"
tests=${PIPESTATUS[0]}
echo "pytest -m 'gpu or multigpu': exit $tests"
[ "$doctor" = 0 ] && [ "$tests" = 0 ]
