"""Raw texts through the encode pool's tokenizer processes against the tokenizers library on one thread,
old code against new, in one run (issue 38, item 2: the pool >= 3x the library's one-thread rate).

    python bench/raw_texts.py                       # 6,000 texts, old = 6793432, best of 3
    python bench/raw_texts.py --old 6793432 --n 6000 --repeat 3

Each figure is a fresh subprocess: the library (`Tokenizer.encode_batch` over windows of 512, with the
pool's truncation, RAYON_NUM_THREADS=1), then the pool of the old and of the new code (`EncodePool`
with the null backend: no model, one tokenizer process; raw texts, the pool warmed on 512 of them
first). Two sets of ~170-token texts: "bench", bench/encode.py's synthetic chunks (100 common words),
and "zipf", words of the model's vocabulary drawn by a Zipf law (s = 1.1: a real text's repetition)
with punctuation. Prints texts/s of each, best of --repeat (interleaved), and the pool / library ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from encode import synthetic_chunks  # noqa: E402
from feed import package_of  # noqa: E402

MEASURE = r"""
import json, os, sys, time
import ingest
assert ingest.__file__.startswith(os.environ.get("PYTHONPATH") or os.path.dirname(ingest.__file__)), ingest.__file__
os.environ["RAYON_NUM_THREADS"] = "1"; os.environ["TOKENIZERS_PARALLELISM"] = "false"
what, path = sys.argv[1], sys.argv[2]
texts = json.load(open(path))
from ingest.model_ref import resolve_model
ref = resolve_model("default")
if what == "library":
    from ingest.workers.encode import load_tokenizer
    tok = load_tokenizer(ref.tokenizer_file, ref.max_seq_length)[0]
    tok.encode_batch(texts[:512])
    started = time.perf_counter()
    for i in range(0, len(texts), 512):
        tok.encode_batch(texts[i:i + 512])
    seconds, busy = time.perf_counter() - started, None
else:
    from ingest.api import EncodePool, encode_multi_process
    with EncodePool(ref, backend="null", tokenizer_workers=1) as pool:
        encode_multi_process(texts[:512], pool)
        before = pool.stats["tokenize_s"]
        started = time.perf_counter()
        rows = encode_multi_process(texts, pool)
        seconds = time.perf_counter() - started
        busy = pool.stats["tokenize_s"] - before
    assert len(rows) == len(texts)
print(json.dumps({"texts_per_s": len(texts) / seconds, "tokenizer_busy_s": busy}))
"""


def zipf_texts(n: int, tokenizer_file: str, seed: int = 0) -> list[str]:
    """n texts of ~170 tokens: whole words of the vocabulary by a Zipf law, some with punctuation."""
    import numpy as np
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_file)
    vocab = [w for w, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1]) if w.isalpha() and w.isascii()]
    rng = np.random.default_rng(seed)
    ranks = np.minimum(rng.zipf(1.1, size=n * 140), len(vocab)) - 1
    marks = rng.choice(["", "", "", "", "", ",", ".", ";", ")"], size=len(ranks))
    words = [vocab[r] + m for r, m in zip(ranks.tolist(), marks.tolist())]
    return [" ".join(words[i * 140:(i + 1) * 140]) for i in range(n)]


def measure(what: str, texts_file: Path, code: Path | None) -> dict:
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = str(code)
    # cwd: not the checkout, whose ingest/ a `-c` interpreter would import before PYTHONPATH's
    out = subprocess.run([sys.executable, "-c", MEASURE, what, str(texts_file)], env=env, capture_output=True,
                         text=True, timeout=900, cwd=texts_file.parent)
    if out.returncode:
        raise SystemExit(f"{what} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=6000, help="texts per measurement")
    ap.add_argument("--old", default="6793432", help="git revision (or source tree) of the old code")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default="", help="write the figures here too")
    args = ap.parse_args()

    from ingest.model_ref import resolve_model

    ref = resolve_model("default")
    work = Path(tempfile.mkdtemp(prefix="bench-raw-texts-"))
    old = package_of(args.old, work / "old")
    sets = {"bench": synthetic_chunks(args.n, ref.tokenizer_file)[0], "zipf": zipf_texts(args.n, ref.tokenizer_file)}
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(ref.tokenizer_file)
    tok.no_truncation()
    results: dict = {}
    for name, texts in sets.items():
        path = work / f"{name}.json"
        path.write_text(json.dumps(texts))
        mean = sum(len(e.ids) for e in tok.encode_batch(texts[:500])) / 500
        best: dict[str, dict] = {}
        for _ in range(args.repeat):
            for label, what, code in (("library, 1 thread", "library", None), (f"old pool ({args.old})", "pool", old),
                                      ("new pool", "pool", None)):
                r = measure(what, path, code)
                if r["texts_per_s"] > best.get(label, {}).get("texts_per_s", 0):
                    best[label] = r
        lib = best["library, 1 thread"]["texts_per_s"]
        print(f"\n{name}: {args.n} texts of {mean:.0f} tokens on average; best of {args.repeat}", flush=True)
        for label, r in best.items():
            busy = r["tokenizer_busy_s"]
            extra = f"   tokenizer process busy {busy:.2f} s ({args.n / busy:,.0f} texts per busy s)" if busy else ""
            print(f"  {label:<24} {r['texts_per_s']:>9,.0f} texts/s   {r['texts_per_s'] / lib:5.2f}x library{extra}")
        results[name] = {"mean_tokens": mean, **{k: v for k, v in best.items()}}
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
