#!/usr/bin/env bash
# On a GPU machine, after scripts/gpu_run.sh installed into /tmp/site (same call): where the supervisor of an
# `ingest run` spends its time. Writes a folder of CHUNKS chunks (bench/gpu_ingest.py's text files), runs
# `ingest run` into STORE under py-spy (the thread holding the supervisor's GIL, 50 samples/s: samples / 50 / seconds is its share), and leaves in $OUT
# the raw stacks (profile-<name>.txt), the report, and a summary of the most sampled frames (profile-<name>.top).
#   STORE=lancedb CHUNKS=150000 bash scripts/gpu_profile.sh
set -uo pipefail
out=${OUT:-bench/out}; mkdir -p "$out"
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH HF_HUB_OFFLINE=1
name=${STORE:-lancedb}; work=$(mktemp -d)
case "$name" in lancedb) uri="lancedb://$work/lance" ;; null) uri="null://" ;; *) uri="$work/store.db" ;; esac
python3 -c "import sys; sys.path.insert(0, 'bench'); from pathlib import Path; from gpu_ingest import write_parts; \
write_parts(Path('$work/docs'), ${CHUNKS:-150000}, ${CHUNKS:-150000})"
out=$(realpath "$out"); model=$(realpath "${MODEL:-.device/model}")
# from the work folder: the project root's ingest/ is not the installed package (loaders/ and workers/ go into it)
(cd "$work" && py-spy record --gil -r 50 -f raw -o "$out/profile-$name.txt" -- python3 -m ingest.cli run docs \
  --store "$uri" --model "$model" --devices "${DEVICE:-cuda:0}" --report "$out/report-$name.json" --quiet)
python3 - "$out/profile-$name.txt" > "$out/profile-$name.top" <<'PY'
import sys
from collections import Counter
leaf, incl, total = Counter(), Counter(), 0
for line in open(sys.argv[1]):
    stack, _, n = line.rstrip().rpartition(" ")
    frames, n = stack.split(";"), int(n)
    total += n
    leaf[frames[-1]] += n
    for f in set(frames):
        incl[f] += n
print("samples", total)
for title, c in (("leaf", leaf), ("inclusive", incl)):
    print(f"\n{title}:")
    for k, v in c.most_common(60):
        print(f"{v:6d} {k[:150]}")
PY
rm -rf "$work"
