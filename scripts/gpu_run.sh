#!/usr/bin/env bash
# On a GPU machine, through the device tool, from the project root, after scripts/gpu_stage.sh ran here:
#   bash scripts/gpu_run.sh              # ONE call, <= 7 minutes with the install: everything issue 38 measures
#                                        # (bench/gpu.py --set issue38), the JSON in $OUT/gpu.json
#   bash scripts/gpu_run.sh probe        # about a minute: install, then check the image still has what it should
#   bash scripts/gpu_run.sh FLAGS...     # extra flags pass through to bench/gpu.py (--set all, --only, --limit, ...)
# It installs the staged wheels and this tree into /tmp/site (no network there), records the device, and runs
# bench/gpu.py in the budget left of TOTAL_S (400 s) after the install.
# After LANCE=1 scripts/gpu_stage.sh (issue 39: LanceDB travels, the model's weights do not):
#   STORES=null:200000,lancedb:200000 bash scripts/gpu_run.sh
# The rehearsal on a CPU (no install, the venv's python first on PATH; tests/test_gpu_bench.py does it):
#   INSTALL=0 DEVICE=cpu N=48 STORES=milvus-lite:64,null:128 MODEL= bash scripts/gpu_run.sh
set -uo pipefail
out=${OUT:-bench/out}; mkdir -p "$out"
site=/tmp/site
if [ "${INSTALL:-1}" != 0 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
    .device/wheels/*.whl || { echo "gpu_run: the staged wheels did not install; run scripts/gpu_stage.sh here"; exit 2; }
  if ! python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir \
       --target "$site" . >"$out/install.log" 2>&1; then
    echo "gpu_run: could not build this tree there ($out/install.log); using the wheel staged by gpu_stage.sh"
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .device/ingest/*.whl || exit 2
  fi
  export PYTHONPATH=$site PATH=$site/bin:$PATH
  if [ -d .device/lance ]; then        # LANCE=1 gpu_stage.sh: lancedb's wheel less its library, and the library xz'd
    python3 - "$site" <<'PY' || { echo "gpu_run: lancedb did not unpack"; exit 2; }
import lzma, shutil, sys, zipfile
from pathlib import Path
site, lance = Path(sys.argv[1]), Path(".device/lance")
zipfile.ZipFile(lance / "lancedb-rest.zip").extractall(site)
so = site / (lance / "so-path").read_text()
with lzma.open(lance / (so.name + ".xz")) as f, so.open("wb") as out:
    shutil.copyfileobj(f, out, 1 << 20)
PY
  fi
fi
if [ -f .device/model/weights.json ] && [ ! -f .device/model/model.safetensors ]; then
  # the shapes of the model's weights, filled with random values (gpu_stage.sh): its speed, not its vectors
  python3 - <<'PY' || { echo "gpu_run: could not make the model's weights"; exit 2; }
import json, torch
from safetensors.torch import save_file
g = torch.Generator().manual_seed(0); out = {}
for name, t in json.load(open(".device/model/weights.json")).items():
    dtype = {"F16": torch.float16, "F32": torch.float32, "BF16": torch.bfloat16}.get(t["dtype"], torch.int64)
    if dtype == torch.int64:
        out[name] = torch.arange(t["shape"][-1]).expand(*t["shape"]).contiguous()  # position ids
    elif "LayerNorm.weight" in name:
        out[name] = torch.ones(t["shape"], dtype=dtype)
    elif name.endswith("bias"):
        out[name] = torch.zeros(t["shape"], dtype=dtype)
    else:
        out[name] = (torch.randn(t["shape"], generator=g) * 0.05).to(dtype)
save_file(out, ".device/model/model.safetensors")
PY
  echo "gpu_run: the model's weights are random values in its shapes (weights.json): speed only"
fi
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,utilization.gpu --format=csv,noheader || true
stores=${STORES:-milvus-lite:30000,null:200000}
python3 bench/gpu.py --probe --stores "$stores" || { echo "gpu_run: the image lacks a package above; stage it as a wheel"; exit 3; }
[ "${1:-}" = probe ] && exit 0
budget=$(( ${TOTAL_S:-400} - SECONDS ))
echo "gpu_run: installed in ${SECONDS} s; measuring within ${budget} s"
model=${MODEL-.device/model}
python3 bench/gpu.py --device "${DEVICE:-cuda:0}" --n "${N:-100000}" ${model:+--model "$model"} --set issue38 \
  --stores "$stores" --out "$out/gpu.json" --budget-s "$budget" "$@"
