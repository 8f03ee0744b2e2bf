"""bench/gpu.py's `ingest_run`: `ingest run` of a generated folder of text files into each store of --stores,
one after the other, each with the device's busy share and the host's CPU per chunk by stage.

A store is one entry of STORES (its name -> the --store URI in the run's work folder); `--stores` names them,
each with its chunks (`milvus-lite:30000,null:200000`; no count: --run-chunks). The folder is written once,
in parts of as many chunks as the smallest run's, and each run takes the parts it needs (`ingest run` of
several PATHs)."""
from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

from encode import WORDS  # the same words as bench/encode.py: one token each
from proctree import sampled_run

STORES: dict[str, Callable[[Path], str]] = {
    "milvus-lite": lambda work: str(work / "store.db"),      # the default store: ~1,600 rows/s on the H200's host
    "null": lambda work: "null://",                           # takes and discards rows: the pipeline's own pace
    "lancedb": lambda work: f"lancedb://{work}/lance",        # needs LANCE=1 scripts/gpu_stage.sh (its wheel: 75 MB)
}
PARAGRAPHS = 16                                               # chunks per file


def stores_of(spec: str, default_chunks: int) -> list[tuple[str, int]]:
    """`name[:chunks],...` as [(name, chunks)]; ValueError naming an unknown store."""
    out = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, chunks = item.partition(":")
        if name not in STORES:
            raise ValueError(f"unknown store {name!r} in --stores; use some of {', '.join(STORES)}")
        out.append((name, int(chunks) if chunks else default_chunks))
    return out


class Busy(threading.Thread):
    """Samples every 0.2 s the device's utilisation (NVML, else nvidia-smi; none on the CPU) and the share
    of all CPUs in use."""

    def __init__(self, device: str):
        super().__init__(daemon=True)
        self.device, self.samples = device, []
        self.halt = threading.Event()

    def run(self) -> None:
        import psutil

        read = self._reader()
        psutil.cpu_percent()
        while not self.halt.wait(0.2):
            self.samples.append((time.perf_counter(), read() if read else None, psutil.cpu_percent()))

    def _reader(self) -> Callable[[], float] | None:
        if not self.device.startswith("cuda"):
            return None
        index = int(self.device.partition(":")[2] or 0)
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            return lambda: float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except Exception:               # no NVML binding: the command line tool
            return lambda: float(subprocess.run(
                ["nvidia-smi", "-i", str(index), "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                capture_output=True, text=True, timeout=5).stdout.strip() or "nan")

    def share(self, since: float, column: int = 1) -> float | None:
        """The mean busy share from `since` (perf_counter) on: the device's (column 1), all CPUs' (2)."""
        values = [s[column] for s in self.samples if s[0] >= since and s[column] is not None]
        return round(sum(values) / len(values) / 100, 3) if values else None


def write_parts(folder: Path, n_chunks: int, part: int) -> list[Path]:
    """Text files of PARAGRAPHS paragraphs of 140-160 words (about one ~190-token chunk each) in sub-folders of
    `part` chunks: the sub-folders, in order."""
    rng, words = random.Random(0), np.array(WORDS)
    picks = np.random.default_rng(0).integers(0, len(WORDS), size=n_chunks * 160)
    at, parts = 0, []
    for f in range((n_chunks + PARAGRAPHS - 1) // PARAGRAPHS):
        sub = folder / f"p{f * PARAGRAPHS // part:03d}"
        if not parts or parts[-1] != sub:
            sub.mkdir(parents=True)
            parts.append(sub)
        paras = []
        for _ in range(min(PARAGRAPHS, n_chunks - f * PARAGRAPHS)):
            k = rng.randint(140, 160)
            paras.append(" ".join(words[picks[at:at + k]]) + ".")
            at += k
        (sub / f"doc{f:06d}.txt").write_text("\n\n".join(paras))
    return parts


def one_run(a, name: str, chunks: int, parts: list[Path], part: int, work: Path) -> dict:
    """`ingest run` of the first parts that hold `chunks` into store `name`: its figures."""
    run_dir = work / name
    run_dir.mkdir()
    paths = [str(p) for p in parts[:max(1, -(-chunks // part))]]
    argv = [sys.executable, "-m", "ingest.cli", "run", *paths, "--store", STORES[name](run_dir),
            "--report", str(run_dir / "report.json"), "--model", a.model_path, "--devices", a.device,
            "--backend", a.run_backend, "--quiet"]
    busy = Busy(a.device)
    busy.start()
    started = time.perf_counter()
    run = sampled_run(argv, run_dir, None)
    busy.halt.set()
    busy.join()
    if run["rc"] != 0:
        return {"status": "error", "exit_code": run["rc"], "stderr": run["stderr"].strip()[-2000:]}
    totals = json.loads((run_dir / "report.json").read_text())["totals"]
    n, first = totals["chunks"], totals["first_row_s"]
    steady_from = started + first if first is not None else None
    return {"status": "ok", "uri": STORES[name](run_dir).replace(str(work), "WORK"), "chunks": n,
            "files": totals["files"], "run_s": totals["seconds"], "first_row_s": first,
            "chunks_per_s": n / totals["seconds"],
            "steady_chunks_per_s": n / (totals["seconds"] - first) if first is not None and totals["seconds"] > first else None,
            "gpu_busy_share": busy.share(started), "gpu_busy_share_steady": busy.share(steady_from) if steady_from else None,
            "cpu_busy_share": busy.share(started, 2),
            "cpu_us_per_chunk": {k: round(v * 1e6 / n, 1) for k, v in sorted(run["stages"].items()) if n},
            "tree_cpu_us_per_chunk": round(run["tree"] * 1e6 / n, 1) if n else None,
            "peak_rss_mb": {k: round(v / 2**20) for k, v in sorted(run["peak_rss"].items())},
            "store_chunks_per_s": totals["chunks_per_s"].get("write"), "store_bound": totals.get("store_bound"),
            "timeline": totals["timeline"]}


def m_ingest_run(a, texts, ids, lengths) -> dict:
    """`ingest run` into each store of --stores (module docstring). Steady chunks/s: the run's chunks over the
    time from its first stored row to its end (the report's first_row_s and seconds); CPU per chunk: the whole
    run's, start-up included, by process role (bench/proctree.py)."""
    runs = stores_of(a.stores, a.run_chunks)
    part = min(c for _, c in runs)
    work = Path(tempfile.mkdtemp(prefix="gpu-bench-run-"))
    try:
        written = time.perf_counter()
        parts = write_parts(work / "docs", max(c for _, c in runs), part)
        out = {"backend": a.run_backend, "folder_written_s": round(time.perf_counter() - written, 3),
               "busy_of": "gpu" if a.device.startswith("cuda") else None, "stores": {}}
        for name, chunks in runs:
            out["stores"][name] = one_run(a, name, chunks, parts, part, work)
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)
