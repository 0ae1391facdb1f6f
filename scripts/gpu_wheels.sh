#!/usr/bin/env bash
# Download the wheels that scripts/gpu_lessons.sh installs on a GPU machine that cannot reach a package index.
#
# The GPU machines this course is checked on have a python3 with torch, numpy, matplotlib and pytest but no
# Jupyter; running the lessons as a learner would (a kernel per notebook) needs nbclient, ipykernel and
# ipywidgets, and the quizzes need jsonschema. This fetches them with everything they need, for that
# machine's Python (3.12 on x86_64 by default), into .whl/ (ignored by git), leaving out the packages that
# machine already has at a version these accept. About 20 MB.
#
# Usage: scripts/gpu_wheels.sh [PYTHON_VERSION]      (run where PyPI is reachable; default 3.12)
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${1:-3.12}"
rm -rf .whl && mkdir -p .whl
python3 -m pip download --quiet --only-binary=:all: --python-version "$VERSION" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  nbclient ipykernel ipywidgets jsonschema
# Already on the GPU image (its package list): keep its own copies, which torch and matplotlib were built against.
for present in psutil python_dateutil packaging typing_extensions pygments attrs six; do
  rm -f .whl/"${present}"-*.whl
done
ls .whl | wc -l | xargs echo "wheels:"
du -sh .whl
