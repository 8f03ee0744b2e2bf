"""Chunks whose token lengths are a real run's (issue 38: `pool_real_lengths`), for bench/gpu.py.

`real_length_chunks(n, tokenizer_file, lengths_file)` gives n chunks in the form of gpu_measures.chunks
(texts, ids concatenated, lengths), each length drawn from `lengths_file` (a JSON list of token counts,
[CLS] and [SEP] included: ../shared/gpu/real_chunk_lengths.json has 22,066, mean 178, p10 92, p90 242,
4% at 256), its ids one-token words as bench/encode.py's. `m_pool_real_lengths(a, lengths_file)` times the
encode pool on them as gpu_measures.m_pool_pretokenized does on the bench's chunks (one warm pass over
a group first). Run alone: `python bench/real_lengths.py LENGTHS_JSON [--n 20000] [--device cuda:0]`.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from encode import WORDS  # noqa: E402  (one token each)


def real_length_chunks(n: int, tokenizer_file: str, lengths_file: str | Path,
                       seed: int = 0) -> tuple[list[str], np.ndarray, np.ndarray]:
    """n texts with token lengths drawn from `lengths_file`, their ids concatenated (int32) and lengths."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_file)
    vocab = np.array([tok.token_to_id(w) for w in WORDS], dtype=np.int32)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    rng = np.random.default_rng(seed)
    real = np.array(json.loads(Path(lengths_file).read_text()), dtype=np.int32)
    lengths = np.maximum(rng.choice(real, size=n), 2).astype(np.int32)
    picks = rng.integers(0, len(WORDS), size=int(lengths.sum() - 2 * n))
    starts = np.concatenate(([0], np.cumsum(lengths - 2)))
    words = np.array(WORDS)
    texts = [" ".join(words[picks[a:b]]) for a, b in zip(starts[:-1], starts[1:])]
    ids = np.empty(int(lengths.sum()), dtype=np.int32)
    ends = np.cumsum(lengths)
    body = np.ones(len(ids), dtype=bool)
    body[ends - lengths] = body[ends - 1] = False
    ids[ends - lengths], ids[ends - 1] = cls, sep
    ids[body] = vocab[picks]
    return texts, ids, lengths


def m_pool_real_lengths(a, lengths_file: str | Path) -> dict:
    """gpu_measures.m_pool_pretokenized on real chunk lengths (a: bench/gpu.py's arguments: n, model_path,
    device, dtype, tokenizer_workers, batch_size)."""
    from gpu_measures import GROUP, _first_vector, _pool_figures, groups_of

    from ingest.model_ref import resolve_model

    texts, ids, lengths = real_length_chunks(a.n, resolve_model(a.model_path).tokenizer_file, lengths_file)
    pool, first = _first_vector(a)
    try:
        for _ in pool.encode_groups(groups_of(texts[:GROUP], ids, lengths)):
            pass
        before, started = pool.stats, time.perf_counter()
        rows = sum(len(v) for _, v in pool.encode_groups(groups_of(texts, ids, lengths)))
        seconds = time.perf_counter() - started
        return {"first_vector_s": first, "mean_tokens": float(lengths.mean()), **_pool_figures(pool, before, rows, seconds)}
    finally:
        pool.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("lengths_file")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--batch-size", type=int, default=None)
    args = ap.parse_args()
    a = argparse.Namespace(n=args.n, model_path="default", device=args.device, tokenizer_workers=None,
                           batch_size=args.batch_size,
                           dtype=args.dtype or ("float16" if args.device.startswith("cuda") else "float32"))
    print(json.dumps(m_pool_real_lengths(a, args.lengths_file), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
