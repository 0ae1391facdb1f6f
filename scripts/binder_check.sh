#!/usr/bin/env bash
# Rehearse what mybinder does with this repository, on one machine and without Docker.
#
# mybinder (repo2docker) builds an image from binder/requirements.txt, runs binder/postBuild from
# the repository root, and starts JupyterLab through binder/start in a container capped at about
# 2 GB of memory. This script does the same steps in the same order:
#
#   1. a fresh virtual environment gets exactly binder/requirements.txt, then binder/postBuild runs;
#   2. `pip check` must pass, the course must import, and ipywidgets' JupyterLab extension must be
#      installed in the environment that serves JupyterLab (else sliders render as plain text);
#   3. JupyterLab starts through binder/start, and every notebook runs through binder/start
#      (so with Binder's defaults: two ranks, one thread each), all inside one memory cgroup capped
#      at Binder's limit; the cgroup's peak memory is printed at the end.
#
# What it cannot rehearse: Docker itself and the download of torch from PyTorch's CPU index where
# that index is unreachable - there, pass the same release from PyPI or a local file with --torch.
#
# Usage: scripts/binder_check.sh [--torch SPEC] [--limit-mib N] [--keep]
#   --torch SPEC    install SPEC instead of requirements.txt's torch line (e.g. torch==2.13.0)
#   --limit-mib N   the memory cap (default 2048, mybinder's limit); needs root and a memory cgroup
#   --keep          keep the environment and logs (printed at the end)
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
TORCH_SPEC="" LIMIT_MIB=2048 KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --torch) TORCH_SPEC="$2"; shift 2 ;;
    --limit-mib) LIMIT_MIB="$2"; shift 2 ;;
    --keep) KEEP=1; shift ;;
    *) echo "binder_check: unknown argument '$1' (allowed: --torch SPEC, --limit-mib N, --keep)" >&2; exit 2 ;;
  esac
done
case "$LIMIT_MIB" in ''|*[!0-9]*) echo "binder_check: --limit-mib '$LIMIT_MIB' must be a whole number of MiB" >&2; exit 2 ;; esac

WORK="$(mktemp -d -t dpteach-binder.XXXXXX)"
CGROUP=""
cleanup() {
  [ -n "${LAB_PID:-}" ] && kill "$LAB_PID" 2>/dev/null || true
  if [ -n "$CGROUP" ] && [ -d "$CGROUP" ]; then
    while read -r pid; do kill "$pid" 2>/dev/null || true; done < "$CGROUP/cgroup.procs"
    sleep 1; rmdir "$CGROUP" 2>/dev/null || true
  fi
  [ "$KEEP" = 1 ] && echo "kept: $WORK" || rm -rf "$WORK"
}
trap cleanup EXIT
step() { printf '\n== %s\n' "$*"; }

step "1. build: fresh environment, binder/requirements.txt, then binder/postBuild"
python3 -m venv "$WORK/env"
PATH="$WORK/env/bin:$PATH"
REQS="$WORK/requirements.txt"
if [ -n "$TORCH_SPEC" ]; then
  # Drop the torch pin and PyTorch's index; install the given torch first.
  grep -v -e '^torch' -e '^--extra-index-url' "$REPO/binder/requirements.txt" > "$REQS"
  pip install --quiet "$TORCH_SPEC"
else
  cp "$REPO/binder/requirements.txt" "$REQS"
fi
start=$(date +%s)
pip install --quiet -r "$REQS"
(cd "$REPO" && bash binder/postBuild >/dev/null)
echo "built in $(( $(date +%s) - start )) s; environment: $(du -sm "$WORK/env" | cut -f1) MiB"

step "2. the environment is consistent and complete"
pip check
python -c "import dpteach, torch; print('dpteach', dpteach.__file__, '| torch', torch.__version__, '| CUDA', torch.version.cuda)"
jupyter labextension list 2>&1 | grep -q "@jupyter-widgets/jupyterlab-manager.*enabled" \
  || { echo "ipywidgets' lab extension is missing: sliders would not render" >&2; exit 1; }
echo "ipywidgets' JupyterLab extension: enabled"
# The notebook runner is this check's own tool, not part of the image.
pip install --quiet pytest nbval

step "3. run: JupyterLab and every notebook through binder/start, capped at ${LIMIT_MIB} MiB"
if [ "$(id -u)" = 0 ] && [ -w /sys/fs/cgroup/memory ]; then            # cgroup v1
  CGROUP=/sys/fs/cgroup/memory/dpteach-binder-$$
  mkdir "$CGROUP"
  echo $(( LIMIT_MIB * 1024 * 1024 )) > "$CGROUP/memory.limit_in_bytes"
  PEAK_FILE="$CGROUP/memory.max_usage_in_bytes" OOM_FILE="$CGROUP/memory.oom_control"
elif [ "$(id -u)" = 0 ] && grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then  # cgroup v2
  CGROUP=/sys/fs/cgroup/dpteach-binder-$$
  mkdir "$CGROUP"
  echo $(( LIMIT_MIB * 1024 * 1024 )) > "$CGROUP/memory.max"
  PEAK_FILE="$CGROUP/memory.peak" OOM_FILE="$CGROUP/memory.events"
else
  echo "no writable memory cgroup (needs root): the notebooks run uncapped and the peak is not measured"
fi
in_cgroup() { if [ -n "$CGROUP" ]; then sh -c 'echo $$ > "$0/cgroup.procs"; exec "$@"' "$CGROUP" "$@"; else "$@"; fi; }

cd "$REPO"
export DPTEACH_PROGRESS="$WORK/progress.json"   # a learner's progress file, not the machine's
PORT=$(python -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
ROOT_FLAG=""; [ "$(id -u)" = 0 ] && ROOT_FLAG=--allow-root   # Binder runs as an ordinary user
in_cgroup binder/start jupyter lab --no-browser --port "$PORT" --IdentityProvider.token=binder-check \
  --ServerApp.root_dir="$REPO" $ROOT_FLAG > "$WORK/lab.log" 2>&1 &
LAB_PID=$!
for _ in $(seq 60); do
  curl -sf "http://127.0.0.1:$PORT/api/status?token=binder-check" >/dev/null 2>&1 && break; sleep 1
done
curl -sf "http://127.0.0.1:$PORT/lab?token=binder-check" >/dev/null || { echo "JupyterLab did not start:"; cat "$WORK/lab.log"; exit 1; }
echo "JupyterLab is serving on port $PORT"
start=$(date +%s)
# A cell may take minutes on a small machine; a kernel killed for memory must not leave pytest waiting.
set +e  # a failed notebook must still let the memory report below print
in_cgroup timeout 1800 binder/start python -m pytest -q -p no:cacheprovider notebooks --nbval-lax \
  --nbval-cell-timeout 600 > "$WORK/notebooks.log" 2>&1
status=$?
set -e
tail -3 "$WORK/notebooks.log"
if [ "$status" != 0 ]; then  # which cells failed, and the first line of each error
  grep -E "^FAILED|^E +[A-Za-z]*(Error|Exception)" "$WORK/notebooks.log" | sort | uniq -c | sort -rn | head -20
fi
echo "notebooks: exit $status in $(( $(date +%s) - start )) s"
if [ -n "$CGROUP" ]; then
  peak=$(( $(cat "$PEAK_FILE") / 1024 / 1024 ))
  echo "peak memory of JupyterLab + kernels + ranks: ${peak} MiB of ${LIMIT_MIB} MiB allowed"
  echo "processes killed for memory: $(awk '$1 == "oom_kill" {print $2}' "$OOM_FILE")"
fi
exit "$status"
