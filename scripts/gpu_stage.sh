#!/usr/bin/env bash
# Stage in .device/ (git-ignored) everything that bench/gpu.py and `ingest run` need on a GPU machine, which
# reaches no network: the fp16 model (.device/model, ~45 MB) and wheels for its Python 3.12 (.device/wheels) of
# what its image lacks. Run here, in the project's venv, before the first GPU call; docs/benchmarks.md has the
# GPU command. Everything that travels shares 64 MiB, so only the missing wheels go: the project's packages the
# runs import, with their needs, less what scripts/gpu_image_packages.txt lists (the image's packages, read from
# the device tool's KINDS.md on 2026-11-26), less faiss-cpu (19 MB; milvus-lite searches a FLAT index without it);
# and a wheel of this tree (.device/ingest), which scripts/gpu_run.sh uses only if it cannot build the tree there.
# LANCE=1 bash scripts/gpu_stage.sh stages LanceDB instead of Milvus Lite, for issue 39's GPU run. Its wheel
# (75 MB) cannot travel as it is, so its 185 MB library goes xz-compressed (.device/lance, 41 MB; 2.5 min to make) and the
# model's weights stay here: .device/model keeps its config, tokenizer and weights.json (each tensor's name,
# dtype and shape), and gpu_run.sh fills those shapes with random values there. A model's speed does not
# depend on its weights' values; its vectors there mean nothing, which no throughput figure reads.
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
prepare=${PREPARE:-../shared/device/prepare.sh}
[ -f .device/model/model.safetensors ] || bash "$prepare" model
pins=$(python - <<'PY'
from importlib.metadata import version
# pymilvus + milvus-lite: the store; pebble: the loader pools; langchain-core: ingest.api (IngestEmbeddings);
# langchain-text-splitters: the chunker's splitters; py-spy: the stacks of a measurement that stalls.
import os
from importlib.metadata import PackageNotFoundError
names = ["pymilvus", "pebble", "langchain-core", "langchain-text-splitters", "py-spy"]
names += ["lancedb"] if os.environ.get("LANCE") == "1" else ["milvus-lite"]
def pin(n):
    try:
        return f"{n}=={version(n)}"
    except PackageNotFoundError:   # py-spy need not be in the venv
        return n
print(" ".join(map(pin, names)))
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
rm -rf .device/all .device/ingest .device/lance
if [ "${LANCE:-0}" = 1 ]; then
  python - <<'PY'
import json, lzma, struct, zipfile
from pathlib import Path
whl = next(Path(".device/wheels").glob("lancedb-*.whl")); lance = Path(".device/lance"); lance.mkdir()
with zipfile.ZipFile(whl) as src, zipfile.ZipFile(lance / "lancedb-rest.zip", "w", zipfile.ZIP_DEFLATED) as rest:
    for info in src.infolist():
        if info.filename.endswith(".so"):
            with src.open(info) as f, lzma.open(lance / (Path(info.filename).name + ".xz"), "wb", preset=9) as out:
                while block := f.read(1 << 20):
                    out.write(block)
            (lance / "so-path").write_text(info.filename)
        else:
            rest.writestr(info, src.read(info))
whl.unlink()
weights = Path(".device/model/model.safetensors")
if weights.exists():                       # keep the header (names, dtypes, shapes), not the values
    with weights.open("rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]; header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    Path(".device/model/weights.json").write_text(json.dumps(
        {k: {"dtype": v["dtype"], "shape": v["shape"]} for k, v in header.items()}))
    weights.unlink()
PY
fi
python -m pip wheel -q --no-deps --no-build-isolation -w .device/ingest . 2>&1 | grep -v "^WARNING: Location" || true
ls .device/wheels
du -sh .device/model .device/wheels .device/ingest .device/lance 2>/dev/null; du -sh .device
