"""The measurements of bench/gpu.py, each run by it in a subprocess of its own (`--measure NAME`); every
measurement takes the parsed arguments and the synthetic chunks, and returns a JSON-able dict."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from encode import WORDS  # the same words as bench/encode.py: one token each
from gpu_ingest import m_ingest_run

ORDER = ("forward_only", "worker_start_s", "pool_pretokenized", "pool_real_lengths", "pool_raw_texts", "ingest_run",
         "bare_encode", "st_pool")
GROUP = 512                                   # chunks per Pretokenized group, as a run's packs
REAL_LENGTHS = Path(__file__).with_name("real_chunk_lengths.json")    # 22,066 chunks' token lengths (issue 38)


# --- the chunks ---------------------------------------------------------------------------------------

def chunks(n: int, tokenizer_file: str, seed: int = 0, real: bool = False) -> tuple[list[str], np.ndarray, np.ndarray]:
    """n texts of 160-206 tokens ([CLS] and [SEP] included), or (`real`) of lengths drawn from REAL_LENGTHS (at
    least 3), their ids concatenated (int32) and lengths."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_file)
    vocab = np.array([tok.token_to_id(w) for w in WORDS], dtype=np.int32)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    rng = np.random.default_rng(seed)
    if real:
        lengths = np.maximum(3, rng.choice(np.array(json.loads(REAL_LENGTHS.read_text())), size=n)).astype(np.int32)
    else:
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
    so no attention mask: on CUDA, SDPA's fastest kernel), already on the device. Two passes over the same
    batches: the first cold (every shape new: on CUDA, a cuDNN plan a shape), the second warm, the compute
    limit (issue 38)."""
    model = _st_model(a)
    rates = {b: _forward_rates(a, model, ids, lengths, b) for b in (int(x) for x in a.forward_batch.split(","))}
    best = max(rates, key=lambda b: rates[b]["warm"])
    return {"chunks": len(texts), "chunks_per_s": rates[best]["warm"], "cold_chunks_per_s": rates[best]["cold"],
            "timed_s": len(texts) / rates[best]["warm"], "batch_size": best, "shapes": rates[best]["shapes"],
            "by_batch_size": {str(b): r for b, r in rates.items()}}


def _forward_rates(a, model, ids, lengths, batch: int) -> dict:
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
    out = {"shapes": len({tuple(b["input_ids"].shape) for b in batches})}
    with torch.inference_mode():
        t = batches[0]["input_ids"][:1, :8]                               # the device's start-up, on a shape of its own
        model({"input_ids": t, "attention_mask": torch.ones_like(t), "token_type_ids": torch.zeros_like(t)})
        for name in ("cold", "warm"):
            _sync(a.device)
            started = time.perf_counter()
            for b in batches:
                model(b)["sentence_embedding"]
            _sync(a.device)
            out[name] = len(order) / (time.perf_counter() - started)
    return out


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
from ingest.workers.encode.torch_model import load; lap("import_worker_model")   # what the encode worker imports
m = load(sys.argv[1], sys.argv[2], getattr(torch, sys.argv[3])); lap("load_model")
ids = torch.full((8, 8), 101, dtype=torch.long, device=sys.argv[2])
with torch.inference_mode():
    m.embed(ids, torch.full((8,), 8, device=sys.argv[2]), True)
if cuda:
    torch.cuda.synchronize()
lap("first_forward")
print(json.dumps(out))
"""


def _pool_figures(pool, before: dict, n: int, seconds: float) -> dict:
    after, plan = pool.stats, pool.batch_plan
    return {"chunks": n, "chunks_per_s": n / seconds, "timed_s": seconds, "worker_startup_s": pool.startup_seconds,
            "batch_plan": {k: getattr(plan, k, None) for k in ("batch_size", "max_tokens", "multiple")},
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


def m_pool_real_lengths(a, texts, ids, lengths) -> dict:
    """`pool_pretokenized` on as many chunks of real lengths (REAL_LENGTHS: ingest run's chunks of the
    development set and samples, context line included)."""
    from ingest.model_ref import resolve_model

    texts, ids, lengths = chunks(len(texts), resolve_model(a.model_path).tokenizer_file, seed=1, real=True)
    out = m_pool_pretokenized(a, texts, ids, lengths)
    out["lengths"] = {"mean": round(float(lengths.mean()), 1), **{f"p{q}": int(np.percentile(lengths, q))
                                                                  for q in (10, 50, 90)}}
    return out


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
    model, texts = _st_model(a), texts[:a.peer_n]
    out = {"chunks": len(texts)}
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
