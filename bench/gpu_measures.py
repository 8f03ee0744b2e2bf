"""The measurements of bench/gpu.py, each run by it in a subprocess of its own (`--measure NAME`); every
measurement takes the parsed arguments and the synthetic chunks, and returns a JSON-able dict."""
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

import numpy as np

from encode import WORDS  # the same words as bench/encode.py: one token each

ORDER = ("forward_only", "worker_start_s", "pool_pretokenized", "pool_raw_texts", "ingest_run",
         "bare_encode", "st_pool")
GROUP = 512                                   # chunks per Pretokenized group, as a run's packs


# --- the chunks ---------------------------------------------------------------------------------------

def chunks(n: int, tokenizer_file: str, seed: int = 0) -> tuple[list[str], np.ndarray, np.ndarray]:
    """n texts of 160-206 tokens ([CLS] and [SEP] included), their ids concatenated (int32) and lengths."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_file)
    vocab = np.array([tok.token_to_id(w) for w in WORDS], dtype=np.int32)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    rng = np.random.default_rng(seed)
    lengths = rng.integers(160, 207, size=n).astype(np.int32)
    picks = rng.integers(0, len(WORDS), size=int(lengths.sum() - 2 * n))
    starts = np.concatenate(([0], np.cumsum(lengths - 2)))
    words = np.array(WORDS)
    texts = [" ".join(words[picks[a:b]]) for a, b in zip(starts[:-1], starts[1:])]
    ids = np.empty(int(lengths.sum()), dtype=np.int32)
    ends = np.cumsum(lengths)
    ids[ends - lengths], ids[ends - 1] = cls, sep
    body = np.ones(len(ids), dtype=bool)
    body[ends - lengths] = body[ends - 1] = False
    ids[body] = vocab[picks]
    return texts, ids, lengths


def groups_of(texts: list[str], ids: np.ndarray, lengths: np.ndarray, size: int = GROUP):
    from ingest.api import Pretokenized

    offsets = np.concatenate(([0], np.cumsum(lengths)))
    for i in range(0, len(texts), size):
        j = min(i + size, len(texts))
        yield i, Pretokenized(texts[i:j], ids[offsets[i]:offsets[j]], lengths[i:j])


# --- measurements (each runs in its own subprocess: `--measure NAME`) ----------------------------------

def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _st_model(a):
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(a.model_path, device=a.device)
    return model.to(getattr(torch, a.dtype)).eval()


def m_forward_only(a, texts, ids, lengths) -> dict:
    """The model alone at each --forward-batch size, on batches of rows of one length each (no padding,
    so no attention mask: on CUDA, SDPA's fastest kernel), already on the device: the best is the
    compute limit."""
    model = _st_model(a)
    rates = {b: _forward_rate(a, model, ids, lengths, b) for b in (int(x) for x in a.forward_batch.split(","))}
    best = max(rates, key=rates.get)
    return {"chunks": len(texts), "chunks_per_s": rates[best], "timed_s": len(texts) / rates[best],
            "batch_size": best, "by_batch_size": {str(b): r for b, r in rates.items()}}


def _forward_rate(a, model, ids, lengths, batch: int) -> float:
    import torch

    order = np.argsort(lengths, kind="stable")
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    batches, i = [], 0
    while i < len(order):
        same = int(np.searchsorted(lengths[order], lengths[order[i]], side="right"))
        rows = order[i:min(same, i + batch)]
        i += len(rows)
        x = np.stack([ids[offsets[k]:offsets[k + 1]] for k in rows]).astype(np.int64)
        t = torch.from_numpy(x).to(a.device)
        batches.append({"input_ids": t, "attention_mask": torch.ones_like(t), "token_type_ids": torch.zeros_like(t)})
    with torch.inference_mode():
        for b in batches[:3]:
            model(b)                                                      # warm-up
        _sync(a.device)
        started = time.perf_counter()
        for b in batches:
            model(b)["sentence_embedding"]
        _sync(a.device)
    return len(order) / (time.perf_counter() - started)


def _first_vector(a):
    from ingest.api import EncodePool, Pretokenized
    from ingest.model_ref import resolve_model

    started = time.perf_counter()
    pool = EncodePool(resolve_model(a.model_path), devices=[a.device], dtype=a.dtype, pretokenized=True,
                      tokenizer_workers=a.tokenizer_workers, batch_size=a.batch_size)
    texts, ids, lengths = chunks(1, resolve_model(a.model_path).tokenizer_file)
    list(pool.encode_groups([(0, Pretokenized(texts, ids, lengths))]))
    return pool, time.perf_counter() - started


def m_worker_start_s(a, texts, ids, lengths) -> dict:
    phases = json.loads(subprocess.run([sys.executable, "-c", PHASES, a.model_path, a.device, a.dtype],
                                       capture_output=True, text=True, timeout=120).stdout or "{}")
    pool, first = _first_vector(a)
    try:
        return {"first_vector_s": first, "worker_startup_s": pool.startup_seconds, "phases_s": phases}
    finally:
        pool.close()


# Where a worker's start-up goes, in a fresh interpreter: each phase's seconds.
PHASES = """
import json, sys, time
t = time.perf_counter(); out = {}
def lap(name):
    global t
    now = time.perf_counter(); out[name] = round(now - t, 3); t = now
import torch; lap("import_torch")
cuda = sys.argv[2].startswith("cuda")
if cuda:
    torch.cuda.init(); torch.zeros(1, device=sys.argv[2]); lap("cuda_init")
import sentence_transformers; lap("import_sentence_transformers")
m = sentence_transformers.SentenceTransformer(sys.argv[1], device="cpu"); lap("load_model_cpu")
m = m.to(sys.argv[2]).to(getattr(torch, sys.argv[3])).eval(); lap("to_device")
with torch.inference_mode():
    m.encode(["a first vector"] * 8)
if cuda:
    torch.cuda.synchronize()
lap("first_forward")
print(json.dumps(out))
"""


def _pool_figures(pool, before: dict, n: int, seconds: float) -> dict:
    after, plan = pool.stats, pool.batch_plan
    return {"chunks": n, "chunks_per_s": n / seconds, "timed_s": seconds, "worker_startup_s": pool.startup_seconds,
            "batch_plan": {"batch_size": plan.batch_size, "max_tokens": plan.max_tokens, "multiple": plan.multiple},
            "window_size": pool.window_size,
            "during": {k: after[k] - before.get(k, 0) for k in after if isinstance(after[k], (int, float))}}


def m_pool_pretokenized(a, texts, ids, lengths) -> dict:
    pool, first = _first_vector(a)
    try:
        for _ in pool.encode_groups(groups_of(texts[:GROUP], ids, lengths)):
            pass                                                          # warm-up: one group
        before, started = pool.stats, time.perf_counter()
        rows = sum(len(v) for _, v in pool.encode_groups(groups_of(texts, ids, lengths)))
        seconds = time.perf_counter() - started
        assert rows == len(texts), (rows, len(texts))
        return {"first_vector_s": first, **_pool_figures(pool, before, rows, seconds)}
    finally:
        pool.close()


def m_pool_raw_texts(a, texts, ids, lengths) -> dict:
    from ingest.api import EncodePool, encode_multi_process
    from ingest.model_ref import resolve_model

    with EncodePool(resolve_model(a.model_path), devices=[a.device], dtype=a.dtype,
                    tokenizer_workers=a.tokenizer_workers, batch_size=a.batch_size) as pool:
        encode_multi_process(texts[:GROUP], pool)                         # warm-up, tokenizers started
        before, started = pool.stats, time.perf_counter()
        rows = encode_multi_process(texts, pool)
        seconds = time.perf_counter() - started
        assert rows.shape[0] == len(texts)
        return {"tokenizer_workers": a.tokenizer_workers or "pool default",
                **_pool_figures(pool, before, len(texts), seconds)}


class Busy(threading.Thread):
    """Samples every 0.2 s the device's utilisation (NVML, else nvidia-smi; the CPU's for a CPU run) and the
    chunks a Lite store's manifest has recorded (read-only; a file's entry comes after its rows are stored)."""

    def __init__(self, device: str, manifest: Path):
        super().__init__(daemon=True)
        self.device, self.manifest, self.samples, self.recorded = device, manifest, [], []
        self.halt = threading.Event()

    def run(self) -> None:
        read = self._reader()
        while not self.halt.wait(0.2):
            self.samples.append((time.perf_counter(), read()))
            self.recorded.append((time.perf_counter(), self._chunks()))

    def _chunks(self) -> int:
        import sqlite3

        try:
            with sqlite3.connect(f"file:{self.manifest}?mode=ro", uri=True, timeout=0.1) as db:
                return db.execute("SELECT coalesce(sum(chunks), 0) FROM files").fetchone()[0]
        except sqlite3.Error:           # not made yet, or busy: nothing more known
            return self.recorded[-1][1] if self.recorded else 0

    def steady(self) -> tuple[float | None, float | None]:
        """Chunks/s from the first recorded chunks to the last, and when the first were recorded (s)."""
        started = [(t, c) for t, c in self.recorded if c > 0]
        if len(started) < 2 or started[-1][1] == started[0][1]:
            return None, None
        (t0, c0), (t1, c1) = started[0], max(started, key=lambda tc: tc[1])
        return (c1 - c0) / max(t1 - t0, 1e-9), t0

    def _reader(self):
        if not self.device.startswith("cuda"):
            import psutil

            psutil.cpu_percent()
            return psutil.cpu_percent
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

    def share(self, since: float) -> float | None:
        values = [v for t, v in self.samples if t >= since]
        return round(sum(values) / len(values) / 100, 3) if values else None


def write_folder(folder: Path, n_chunks: int, paragraphs: int = 16) -> None:
    """Text files of `paragraphs` paragraphs of 140-160 words: about one ~190-token chunk each."""
    folder.mkdir(parents=True)
    rng, words = random.Random(0), np.array(WORDS)
    picks = np.random.default_rng(0).integers(0, len(WORDS), size=n_chunks * 160)
    at = 0
    for f in range((n_chunks + paragraphs - 1) // paragraphs):
        paras = []
        for _ in range(min(paragraphs, n_chunks - f * paragraphs)):
            k = rng.randint(140, 160)
            paras.append(" ".join(words[picks[at:at + k]]) + ".")
            at += k
        (folder / f"doc{f:06d}.txt").write_text("\n\n".join(paras))


def m_ingest_run(a, texts, ids, lengths) -> dict:
    work = Path(tempfile.mkdtemp(prefix="gpu-bench-run-"))
    try:
        written = time.perf_counter()
        write_folder(work / "docs", a.run_chunks)
        written = time.perf_counter() - written
        argv = [sys.executable, "-m", "ingest.cli", "run", "docs", "--store", str(work / "store.db"),
                "--report", str(work / "report.json"), "--model", a.model_path, "--devices", a.device,
                "--backend", "torch", "--quiet"]
        busy = Busy(a.device, work / "store.db.documents.manifest.sqlite")
        busy.start()
        started = time.perf_counter()
        proc = subprocess.run(argv, cwd=work, capture_output=True, text=True)
        busy.halt.set()
        busy.join()
        if proc.returncode != 0:
            raise RuntimeError(f"ingest run exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
        totals = json.loads((work / "report.json").read_text())["totals"]
        steady, first_recorded = busy.steady()
        return {"chunks": totals["chunks"], "files": totals["files"], "folder_written_s": written,
                "run_s": totals["seconds"], "first_row_s": totals["first_row_s"],
                "chunks_per_s": totals["chunks"] / totals["seconds"],
                "steady_chunks_per_s": steady, "steady_from_s": first_recorded and first_recorded - started,
                "busy_share": busy.share(started),
                "busy_share_steady": busy.share(first_recorded) if first_recorded else None,
                "busy_of": "gpu" if a.device.startswith("cuda") else "all cpus", "timeline": totals["timeline"]}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def m_bare_encode(a, texts, ids, lengths) -> dict:
    model, texts = _st_model(a), texts[:a.peer_n]
    model.encode(texts[:64], batch_size=32)                               # warm-up
    rates = {}
    for b in a.bare_batch_sizes:
        started = time.perf_counter()
        model.encode(texts, batch_size=b)
        _sync(a.device)
        rates[b] = len(texts) / (time.perf_counter() - started)
    best = max(rates, key=rates.get)
    return {"chunks": len(texts), "chunks_per_s": rates[best], "best_batch_size": best,
            "by_batch_size": {str(b): r for b, r in rates.items()}}


def m_st_pool(a, texts, ids, lengths) -> dict:
    model, texts, out = _st_model(a), texts[:a.peer_n], {"chunks": len(texts)}
    for procs in (1, 2):
        started = time.perf_counter()
        pool = model.start_multi_process_pool([a.device] * procs)
        try:
            model.encode(texts[:procs], pool=pool, batch_size=a.bare_batch_sizes[0])
            start_s, started = time.perf_counter() - started, time.perf_counter()
            model.encode(texts, pool=pool, batch_size=a.bare_batch_sizes[0])
            out[f"processes_{procs}"] = {"chunks_per_s": len(texts) / (time.perf_counter() - started),
                                         "startup_s": start_s}
        finally:
            model.stop_multi_process_pool(pool)
            model.to(a.device)                    # starting the pool moved it to the CPU
    out["chunks_per_s"] = max(out["processes_1"]["chunks_per_s"], out["processes_2"]["chunks_per_s"])
    return out


MEASURE = {name: globals()[f"m_{name}"] for name in ORDER}


def measure(a) -> int:
    """In the subprocess: one measurement, its result written to a.result as JSON."""
    from ingest.model_ref import resolve_model

    started = time.perf_counter()
    texts, ids, lengths = chunks(a.n, resolve_model(a.model_path).tokenizer_file)
    made = time.perf_counter() - started
    result = MEASURE[a.measure](a, texts, ids, lengths)
    result.update(chunks_made_s=round(made, 3), mean_tokens=round(float(lengths.mean()), 1))
    Path(a.result).write_text(json.dumps(result))
    return 0
