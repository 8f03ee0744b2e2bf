#!/usr/bin/env bash
# Stage in .device/ (git-ignored) everything that bench/gpu.py and `ingest run` need on a GPU machine, which
# reaches no network: the fp16 model (.device/model, ~45 MB) and wheels for its Python 3.12 (.device/wheels) of
# what its image lacks. Run here, in the project's venv, before the first GPU call; docs/benchmarks.md has the
# GPU command. Everything that travels shares 64 MiB, so only the missing wheels go: the project's packages the
# runs import, with their needs, less what scripts/gpu_image_packages.txt lists (the image's packages, read from
# the device tool's KINDS.md on 2026-11-26), less faiss-cpu (19 MB; milvus-lite searches a FLAT index without it);
# and a wheel of this tree (.device/ingest), which scripts/gpu_run.sh uses only if it cannot build the tree there.
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
prepare=${PREPARE:-../shared/device/prepare.sh}
[ -f .device/model/model.safetensors ] || bash "$prepare" model
pins=$(python - <<'PY'
from importlib.metadata import version
# pymilvus + milvus-lite: the store; pebble: the loader pools; langchain-core: ingest.api (IngestEmbeddings);
# langchain-text-splitters: the chunker's splitters; py-spy: the stacks of a measurement that stalls.
names = ["pymilvus", "milvus-lite", "pebble", "langchain-core", "langchain-text-splitters", "py-spy"]
print(" ".join(f"{n}=={version(n)}" for n in names))
PY
)
rm -rf .device/wheels .device/all && mkdir -p .device/all .device/wheels
python -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 \
  --platform any -d .device/all $pins 2>&1 | grep -v "^WARNING: Location" || true
python - <<'PY'
import re, shutil
from pathlib import Path
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
image = {norm(l) for l in Path("scripts/gpu_image_packages.txt").read_text().split()} | {"faiss-cpu"}
for whl in sorted(Path(".device/all").glob("*.whl")):
    if norm(whl.name.split("-")[0]) not in image:
        shutil.move(str(whl), ".device/wheels")
PY
rm -rf .device/all .device/ingest
python -m pip wheel -q --no-deps --no-build-isolation -w .device/ingest . 2>&1 | grep -v "^WARNING: Location" || true
ls .device/wheels
du -sh .device/model .device/wheels .device/ingest
