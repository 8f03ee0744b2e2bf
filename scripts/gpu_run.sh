#!/usr/bin/env bash
# On a GPU machine, through the device tool, from the project root, after scripts/gpu_stage.sh ran here:
#   bash scripts/gpu_run.sh probe        # about a minute: install, then check the image still has what it should
#   bash scripts/gpu_run.sh [FLAGS]      # the measurement: bench/gpu.py --device cuda:0 --n 100000 [FLAGS]
# It installs the staged wheels and this tree into /tmp/site (no network there), records the device, runs
# bench/gpu.py inside a 420 s budget and leaves its JSON in $OUT/gpu.json (bench/out/ where $OUT is unset).
set -uo pipefail
out=${OUT:-bench/out}; mkdir -p "$out"
site=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
  .device/wheels/*.whl || { echo "gpu_run: the staged wheels did not install; run scripts/gpu_stage.sh here"; exit 2; }
if ! python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir \
     --target "$site" . >"$out/install.log" 2>&1; then
  echo "gpu_run: could not build this tree there ($out/install.log); using the wheel staged by gpu_stage.sh"
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .device/ingest/*.whl || exit 2
fi
export PYTHONPATH=$site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PATH=$site/bin:$PATH
nvidia-smi --query-gpu=name,driver_version,memory.total,utilization.gpu --format=csv,noheader || true
python3 bench/gpu.py --probe || { echo "gpu_run: the image lacks a package above; stage it as a wheel"; exit 3; }
[ "${1:-}" = probe ] && exit 0
python3 bench/gpu.py --device cuda:0 --n 100000 --model .device/model --out "$out/gpu.json" --budget-s 420 "$@"
