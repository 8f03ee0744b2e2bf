"""Encode backends: which one a run uses, and the ONNX exports they need (made once, cached).

    torch      the SentenceTransformer under torch (CPU or CUDA): the reference vectors
    onnx       the same graph exported to ONNX, fp32, run by ONNX Runtime on the CPU
    onnx-int8  that graph with int8 weights (dynamic quantization, per channel), one text a call
    openvino   the fp32 graph compiled by OpenVINO for this CPU (bfloat16 where it has AMX)
    null       no model: constant unit vectors of the model's dimension, to measure the host
               pipeline (loading, chunking, writing) without the model's cost (bench/feed.py); its
               vectors are never cached nor reused from the store
    stub       null's vectors taken as a model's: cached and reused like a real backend's, in a GPU's
               batches, so the host does all it does in a GPU run at no model cost (bench/feed.py
               --backend stub)
    auto       a collection's own backend; for a new collection torch on a host with an NVIDIA
               GPU, else the fastest exact backend measured at export (never int8: see choose)

Exports live in the user cache (INGEST_CACHE_DIR, else $XDG_CACHE_HOME/ingest, else
~/.cache/ingest) under onnx/<key>, the key a hash of the model directory's files (names,
sizes, modification times), of the CPU (model and flags: the int8 recipe, OpenVINO's
precision and the measured speeds belong to it) and of the export's version. The export runs once, in a process of
its own (python -m ingest.onnx_export), under a file lock, so the caller never imports torch; it
ends with the run that started it, even a SIGKILLed one (watch_parent), so no orphan holds the lock.
"""
from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from ingest.model_ref import ModelRef

BACKENDS = ("torch", "onnx", "onnx-int8", "openvino", "null", "stub")
MODEL_FREE = ("null", "stub")      # no model runs: constant unit vectors
EXACT = ("torch", "onnx", "openvino")    # cosine >= 0.9999 to torch: same top-5 sources (bench/parity.py)
LIGHT_MARGIN = 1.1       # auto prefers a backend without torch (ready in ~0.3 s, not ~4 s) within this of torch
CHOICES = ("auto", *BACKENDS)
EXPORT_VERSION = "3"        # 3: int8 guarded one text a call (workers/encode/onnx_model.py NOTE: int8)
EXPORT_TIMEOUT_S = 1800


class BackendError(RuntimeError):
    """A backend cannot be used (its export failed or was refused); the message is one line."""


def cache_dir() -> Path:
    root = os.environ.get("INGEST_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ingest"
    return Path(root)


def export_dir(model: ModelRef) -> Path:
    """Where the model's exports live: keyed by its files' names, sizes and times, and the export version."""
    digest = hashlib.sha256(f"{EXPORT_VERSION}\0{model.path}\0{model.max_seq_length}\0{_cpu()}".encode())
    root = Path(model.path)
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        st = f.stat()
        digest.update(f"\0{f.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return cache_dir() / "onnx" / digest.hexdigest()[:24]


def _cpu() -> str:
    """This CPU's model name and flags (Linux), else the platform's machine name."""
    try:
        block = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        import platform

        return platform.machine()
    return "\n".join(line for line in block.splitlines() if line.startswith(("model name", "flags")))


def exported(model: ModelRef) -> dict | None:
    """The export's record (export.json) if the model was exported, else None."""
    meta = export_dir(model) / "export.json"
    return json.loads(meta.read_text()) if meta.is_file() else None


def ensure_export(model: ModelRef) -> dict:
    """Export the model once (fp32, int8 and OpenVINO's check, each behind its guard) and return its record."""
    record = exported(model)
    if record is not None:
        return record
    out = export_dir(model)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        lock = open(f"{out}.lock", "w")
    except OSError as exc:
        raise BackendError(f"cannot write the ONNX cache {out.parent}: {exc.strerror}; set INGEST_CACHE_DIR "
                           "to a writable directory") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)        # another process may be exporting the same model
        record = exported(model)
        if record is not None:
            return record
        print(f"ingest: exporting {model.name} to ONNX (once; cached in {out})", file=sys.stderr)
        env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", INGEST_PARENT_PID=str(os.getpid()))
        try:
            proc = subprocess.run([sys.executable, "-m", "ingest.onnx_export", model.path, str(out)],
                                  capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S, env=env)
        except subprocess.TimeoutExpired:
            raise BackendError(f"ONNX export of {model.name} took over {EXPORT_TIMEOUT_S} s; "
                               "use backend = \"torch\"") from None
        if proc.returncode != 0 or exported(model) is None:
            lines = proc.stderr.strip().splitlines()
            raise BackendError(f"ONNX export of {model.name} failed: {lines[-1] if lines else proc.returncode}; "
                               "use backend = \"torch\"")
        return exported(model)


def model_file(model: ModelRef, backend: str) -> str:
    """The .onnx file of an ONNX backend (exported now if needed); "" for torch and null."""
    if backend == "torch" or backend in MODEL_FREE:
        return ""
    entry = ensure_export(model)[backend]
    if not entry["ok"]:
        raise BackendError(f"backend {backend} refused for {model.name}: {entry['reason']}; "
                           "use another backend (\"onnx\" or \"torch\")")
    return str(export_dir(model) / entry["file"])


def has_nvidia_gpu() -> bool:
    """An NVIDIA device node is present (checked without importing torch)."""
    return bool(glob.glob("/dev/nvidia[0-9]*"))


def choose(requested: str, model: ModelRef, recorded: str | None = None, devices: object = "auto") -> str:
    """The backend to use: `requested` unless "auto"; then the collection's `recorded` one; else
    torch for CUDA devices or an NVIDIA host; else the fastest exact backend (torch, onnx,
    openvino: guarded at cosine >= 0.9999 to torch) by the chunks/s the export measured here,
    one without torch winning within LIGHT_MARGIN; torch where the export failed (said on
    stderr). Never onnx-int8: it changed the top-5 sources of 11 of 20 sample queries
    (bench/parity.py), so it is for users who choose it."""
    if requested != "auto":
        return requested
    if recorded:
        return recorded
    names = [devices] if isinstance(devices, str) else list(devices)   # type: ignore[arg-type]
    if any(str(n).startswith("cuda") for n in names) or (names == ["auto"] and has_nvidia_gpu()):
        return "torch"
    try:
        record = ensure_export(model)
    except BackendError as exc:
        print(f"ingest: {exc}; using torch", file=sys.stderr)
        return "torch"
    rate = {b: record[b]["chunks_per_s"] for b in EXACT if record.get(b, {}).get("ok")}
    return max(rate, key=lambda b: rate[b] * (1 if b == "torch" else LIGHT_MARGIN))
