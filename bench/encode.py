"""Throughput of our EncodePool against bare SentenceTransformer.encode and the
sentence-transformers multi-process pool, in one run on the same synthetic chunks.

    python bench/encode.py --n 600                       # CPU: one worker using every core
    python bench/encode.py --n 600 --backends torch,onnx,onnx-int8 --skip-st-pool   # CPU backends
    python bench/encode.py --n 100000 --devices cuda:0   # GPU (float16 by default)
    python bench/encode.py --n 1000 --mixed --bare-batch-sizes 16,32,64 --skip-st-pool   # CPU parity, mixed

Chunks are random common words cut to 160-206 tokens (about 183 on average), the size the
chunker produces; --mixed: 3-150 random words each. All three run side by side (idle while another is measured), interleaved
--repeat times. Prints chunks/s of each (best), the ratios, worker start-up seconds, and for
each pool the cosine of its rows against bare encode's. --backends adds an EncodePool per backend.
Goals: ours >= 0.95 x bare encode on CPU; >= 25,000 chunks/s on one H100 in float16; onnx-int8
>= 1.4x bare torch encode on an AVX2 CPU (>= 2.5x with VNNI) at cosine mean >= 0.99, min >= 0.97.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

WORDS = ("time year people way day man thing woman life child world school state family student group "
         "country problem hand part place case week company system program question work government "
         "number night point home water room mother area money story fact month lot right study book "
         "eye job word business issue side kind head house service friend father power hour game line "
         "end member law car city community name president team minute idea kid body information back "
         "parent face others level office door health person art war history party result change morning "
         "reason research girl guy moment air teacher force education").split()


def synthetic_chunks(n: int, tokenizer_file: str, seed: int = 0) -> tuple[list[str], float]:
    """n texts of 160-206 tokens each (special tokens included), and their mean token count."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_file)
    tok.no_truncation()
    rng = random.Random(seed)
    texts, total = [], 0
    for _ in range(n):
        target = rng.randint(160, 206)
        words = [rng.choice(WORDS) for _ in range(target)]
        while len(tok.encode(" ".join(words)).ids) > target:
            words.pop()
        texts.append(" ".join(words))
        total += len(tok.encode(texts[-1]).ids)
    return texts, total / n


def mixed_texts(n: int, seed: int = 0) -> tuple[list[str], float]:
    """n texts of 3-150 random words, and their mean word count."""
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 150))) for _ in range(n)]
    return texts, sum(len(t.split()) for t in texts) / n


def timed(label: str, fn, n: int, outputs: dict) -> float:
    started = time.perf_counter()
    outputs[label] = fn()
    seconds = time.perf_counter() - started
    print(f"{label:<34} {n / seconds:>10,.1f} chunks/s   ({seconds:.1f} s)", flush=True)
    return n / seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=600, help="chunks to encode (default 600: a few minutes on 2 CPU cores)")
    ap.add_argument("--devices", default="auto",
                    help="\"auto\", or a comma-separated list such as cuda:0,cuda:1 or cpu,cpu")
    ap.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"],
                    help="default: float16 on CUDA, float32 on CPU")
    ap.add_argument("--batch-size", type=int, default=None, help="EncodePool rows per batch (default: the device's)")
    ap.add_argument("--max-batch-tokens", type=int, default=None, help="EncodePool padded tokens per batch")
    ap.add_argument("--bare-batch-sizes", default="32",
                    help="comma list: bare encode runs at each; ratios are against its best (default 32)")
    ap.add_argument("--mixed", action="store_true", help="texts of 3-150 words instead of ~183-token chunks")
    ap.add_argument("--compile", action="store_true", help="EncodePool(compile=True) (torch.compile)")
    ap.add_argument("--tokenizer-workers", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=1, help="measure each this many times, interleaved; report the best")
    ap.add_argument("--skip-st-pool", action="store_true", help="leave out the sentence-transformers pool")
    ap.add_argument("--backends", default="torch", help="comma list of EncodePool backends: torch,onnx,onnx-int8")
    args = ap.parse_args()

    import torch
    from sentence_transformers import SentenceTransformer

    from ingest.api import EncodePool
    from ingest.model_ref import resolve_model

    ref = resolve_model("default")
    if args.devices == "auto":
        devices = [f"cuda:{i}" for i in range(torch.cuda.device_count())] or ["cpu"]
    else:
        devices = args.devices.split(",")
    dtype = args.dtype or ("float16" if devices[0].startswith("cuda") else "float32")
    if args.mixed:
        texts, mean_words = mixed_texts(args.n)
        what = f"{args.n} texts of 3-150 words ({mean_words:.0f} on average)"
    else:
        texts, mean_tokens = synthetic_chunks(args.n, ref.tokenizer_file)
        what = f"{args.n} chunks of {mean_tokens:.0f} tokens on average"
    bare_sizes = [int(b) for b in args.bare_batch_sizes.split(",")]
    print(f"{what}; devices {devices}; {dtype}; bare batch sizes {bare_sizes}; pool batch size "
          f"{args.batch_size or 'auto'}; {len(os.sched_getaffinity(0))} CPU cores; torch {torch.__version__}"
          + (f"; {torch.cuda.get_device_name(0)}" if devices[0].startswith("cuda") else ""), flush=True)

    model = SentenceTransformer(ref.path, device=devices[0]).to(getattr(torch, dtype))
    model.encode(texts[:64], batch_size=32)                                                # warm-up
    runs = {f"bare {b}": (f"bare model.encode ({devices[0]}, batch {b})",
                          lambda b=b: model.encode(texts, batch_size=b)) for b in bare_sizes}
    startups = {}
    st_pool = None
    if not args.skip_st_pool:
        started = time.perf_counter()
        st_pool = model.start_multi_process_pool(devices)
        model.encode(texts[:len(devices)], pool=st_pool, batch_size=bare_sizes[0])     # includes worker start
        startups["st pool"] = time.perf_counter() - started
        model.to(devices[0])                       # starting the pool moved it to the CPU
        runs["st pool"] = (f"sentence-transformers pool x{len(devices)}",
                           lambda: model.encode(texts, pool=st_pool, batch_size=bare_sizes[0]))
    pools: dict[str, EncodePool] = {}
    outputs: dict = {}
    try:
        for backend in args.backends.split(","):
            name = "ours" if backend == "torch" else f"ours {backend}"
            pool = pools[name] = EncodePool(ref, devices=devices if args.devices != "auto" else "auto",
                                            batch_size=args.batch_size, max_batch_tokens=args.max_batch_tokens,
                                            dtype=args.dtype, backend=backend, compile=args.compile,
                                            tokenizer_workers=args.tokenizer_workers)
            started = time.perf_counter()
            pool.wait_ready()
            startups[name] = time.perf_counter() - started
            pool.encode(texts[:512] if args.compile else texts[:64])           # warm-up (compile: every shape)
            runs[name] = (f"{name} EncodePool x{len(pool.worker_pids)}", lambda pool=pool: pool.encode(texts))
        rates = {name: 0.0 for name in runs}
        before = {name: pool.stats for name, pool in pools.items()}
        for _ in range(args.repeat):               # interleaved: drifts of a shared machine hit all alike
            for name, (label, fn) in runs.items():
                rates[name] = max(rates[name], timed(label, fn, args.n, outputs))
        stats = {name: pool.stats for name, pool in pools.items()}
        worker_startups = {name: pool.startup_seconds for name, pool in pools.items()}
        plans = {name: pool.batch_plan for name, pool in pools.items()}
    finally:
        for pool in pools.values():
            pool.close()
        if st_pool is not None:
            model.stop_multi_process_pool(st_pool)

    import numpy as np

    best = max((k for k in rates if k.startswith("bare")), key=lambda k: rates[k])
    bare = outputs[runs[best][0]]
    print(f"\nbest of {args.repeat}:" if args.repeat > 1 else "")
    print(f"bare encode is fastest at batch {best.split()[1]}: {rates[best]:,.1f} chunks/s; ratios are against it")
    for name in [k for k in rates if not k.startswith("bare")]:
        rows = outputs[runs[name][0]]
        cos = (rows * bare).sum(1) / (np.linalg.norm(rows, axis=1) * np.linalg.norm(bare, axis=1))
        print(f"{name} / bare: {rates[name] / rates[best]:.3f}   cosine to bare: mean {cos.mean():.4f}, "
              f"min {cos.min():.4f}")
    if "st pool" in rates and "ours" in rates:
        print(f"ours / st pool: {rates['ours'] / rates['st pool']:.3f}")
    if "st pool" in startups:
        print(f"st pool start-up (workers unpickle the model; seen at first result): {startups['st pool']:.1f} s")
    for name, plan in plans.items():
        print(f"{name}: batches of at most {plan.batch_size} rows and {plan.max_tokens:,} padded tokens")
    for name, pool_stats in stats.items():
        print(f"{name}: start-up per worker {', '.join(f'{s:.1f} s' for s in worker_startups[name])}; during the "
              f"timed runs tokenizing {pool_stats['tokenize_s'] - before[name]['tokenize_s']:.2f} s, "
              f"encoding {pool_stats['encode_s'] - before[name]['encode_s']:.2f} s (summed over processes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
