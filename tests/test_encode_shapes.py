"""Issue 38 on the CPU: bounded batch shapes, no mask where a batch's rows fill it, the encode worker's
BERT in torch alone, and the tokenizer processes' word cache: the vectors still equal
SentenceTransformer.encode's, the token ids the tokenizer's, and a run meets a bounded set of shapes."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

os.environ["HF_HUB_OFFLINE"] = "1"

from ingest.api import EncodePool, Pretokenized  # noqa: E402
from ingest.model_ref import resolve_model  # noqa: E402
from ingest.workers.encode import load_tokenizer  # noqa: E402
from ingest.workers.encode import word_cache  # noqa: E402
from ingest.workers.encode._shapes import make_plan, plan_shapes  # noqa: E402

MODEL = resolve_model()
WORDS = "river stone light paper garden engine winter signal harbor market violin copper".split()   # a token each
ODD = [" ", "\n", "\t", "  ", "\x0b", "\x0c", "\x1c", "\x85", "\xa0", "\u3000", "\u2028", "\u200b", "\x00", ""]
PIECES = ("Hello, world! naïve café résumé Ünïcödé 東京都 日本語 😀 don't e.g. U.S.A. ---- (paren) [x] {y} x=1+2 "
          "supercalifragilisticexpialidocious İstanbul ǅ Ⅻ \u0301a x\u200by \ufffd").split() + ["a" * 150, "ab" * 60]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def st_model():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(MODEL.path, device="cpu")


def varied_texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["", " ", "a", "\x0b"] + ["".join(rng.choice(PIECES + WORDS) + rng.choice(ODD)
                                             for _ in range(rng.randint(0, 400))) for _ in range(n)]


def test_word_cache_gives_the_tokenizers_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tokenizer processes' ids from the word cache are encode_batch's: punctuation, unicode, long words,
    odd whitespace, empty texts, truncation at max_seq_length, and after the cache is emptied; a text the
    tokenizer rejects raises (the process then falls back to encode_batch, which finds it)."""
    tok, _ = load_tokenizer(MODEL.tokenizer_file, MODEL.max_seq_length)
    words = word_cache.exact_words(MODEL.tokenizer_file, tok, MODEL.max_seq_length)
    monkeypatch.setattr(word_cache, "MAX_WORDS", 40)
    texts = varied_texts(300, seed=1)
    truncated = 0
    for i in range(0, len(texts), 37):
        window = texts[i:i + 37]
        flat, lengths = words(window)
        assert flat.dtype == np.int32 and lengths.dtype == np.int32
        expected = [e.ids for e in tok.encode_batch(window)]
        assert [a.tolist() for a in np.split(flat, np.cumsum(lengths)[:-1])] == expected
        truncated += sum(len(e) == MODEL.max_seq_length for e in expected)
    assert truncated > 10
    with pytest.raises(Exception):
        words(["fine", "a lone surrogate \ud800 here"])


def test_bert_in_torch_matches_model_encode_with_and_without_mask(st_model) -> None:
    """The worker's model (torch alone) gives model.encode's vectors on texts of many lengths, padded with a
    mask and, where every row of a batch has one length, without; and loading it imports neither
    sentence-transformers nor transformers."""
    import torch

    from ingest.workers.encode.torch_model import Bert, load

    model = load(MODEL.path, "cpu", torch.float32)
    assert isinstance(model, Bert) and model.dim == 384 and model.max_seq_length == MODEL.max_seq_length
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(n)) for n in [1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 300]]
    texts += [" ".join(rng.choice(WORDS) for _ in range(30)) for _ in range(5)]         # five of 32 tokens
    ref = st_model.encode(texts, batch_size=64)
    tok, pad = load_tokenizer(MODEL.tokenizer_file, MODEL.max_seq_length)
    ids = [e.ids for e in tok.encode_batch(texts)]
    lengths = np.array([len(i) for i in ids])
    padded = np.full((len(ids), lengths.max()), pad)
    for row, i in enumerate(ids):
        padded[row, :len(i)] = i
    with torch.inference_mode():
        masked = model.embed(torch.from_numpy(padded).long(), torch.from_numpy(lengths), False).numpy()
        same = np.flatnonzero(lengths == 32)
        unmasked = model.embed(torch.from_numpy(padded[same, :32]).long(), torch.from_numpy(lengths[same]), True)
    assert len(same) == 5
    assert cosines(masked, ref).min() >= 0.99999 and np.allclose(masked, ref, atol=1e-5)
    assert cosines(unmasked.numpy(), ref[same]).min() >= 0.99999 and np.allclose(unmasked.numpy(), ref[same], atol=1e-5)
    code = ("import sys, torch; from ingest.workers.encode.torch_model import Bert, load; "
            f"assert isinstance(load({MODEL.path!r}, 'cpu', torch.float32), Bert); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sentence_transformers', 'transformers')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-2000:]


def chunk_ids(lengths: np.ndarray, seed: int) -> tuple[list[str], np.ndarray]:
    """Texts of one-token words with exactly `lengths` tokens each ([CLS] and [SEP] included), and their ids."""
    tok, _ = load_tokenizer(MODEL.tokenizer_file, MODEL.max_seq_length)
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(WORDS, size=int(n) - 2)) for n in lengths]
    ids = np.concatenate([e.ids for e in tok.encode_batch(texts)]).astype(np.int32)
    assert len(ids) == lengths.sum()
    return texts, ids


def groups(texts: list[str], ids: np.ndarray, lengths: np.ndarray, seed: int):
    """Pretokenized groups of random sizes, as a run's parts come."""
    rng = random.Random(seed)
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    i = 0
    while i < len(texts):
        j = min(len(texts), i + rng.randint(1, 700))
        yield i, Pretokenized(texts[i:j], ids[offsets[i]:offsets[j]], lengths[i:j])
        i = j


def test_a_run_meets_a_bounded_set_of_batch_shapes() -> None:
    """Over 6,000 chunks of 3-256 tokens in groups of random sizes (many windows, each ending in a short
    batch), a bounded plan's pool meets at most its plan's shapes (32 for the CPU's plan); the exact plan
    (before issue 38) meets far more. The shapes are the coordinator's, so the null backend counts them."""
    lengths = np.random.default_rng(5).integers(3, 257, size=6000).astype(np.int32)
    texts, ids = chunk_ids(lengths, seed=5)
    seen = {}
    for shapes in ("exact", "bounded"):
        with EncodePool(backend="null", batch_shapes=shapes, pretokenized=True) as pool:
            rows = sum(len(v) for _, v in pool.encode_groups(groups(texts, ids, lengths, seed=6)))
            assert rows == len(texts)
            seen[shapes], plan = pool.stats["shapes"], pool.batch_plan
    bound = len(plan_shapes(plan))
    assert plan == make_plan("cpu", MODEL.max_seq_length, None, None, False, "bounded") and bound == 32
    assert 8 <= seen["bounded"] <= bound < seen["exact"], seen


@pytest.mark.slow
def test_bounded_warmed_pool_matches_model_encode(st_model, tmp_path) -> None:
    """Bounded shapes (rows copied to fill a window's last batches), warm-up at start, and batches whose rows
    all fill their width (no mask): the vectors are model.encode's; the worker never imports sentence-transformers."""
    lengths = np.concatenate([np.random.default_rng(7).integers(3, 257, size=150), [32] * 9, [64] * 5]).astype(np.int32)
    texts, ids = chunk_ids(lengths, seed=7)
    texts[-1] = "MODULES? " + texts[-1]                      # the fault hook's marker: its ids stay the old text's
    rules = {"match": "MODULES?", "action": "modules", "file": str(tmp_path / "modules.json")}
    os.environ["INGEST_FAULT"] = json.dumps(rules)
    try:
        with EncodePool(batch_shapes="bounded", warm_up="always", batch_size=8, max_batch_tokens=512,
                        pretokenized=True) as pool:
            out = np.concatenate([v for _, v in pool.encode_groups(groups(texts, ids, lengths, seed=8))])
            assert pool.stats["shapes"] <= len(plan_shapes(pool.batch_plan))
    finally:
        del os.environ["INGEST_FAULT"]
    texts[-1] = texts[-1].removeprefix("MODULES? ")
    ref = st_model.encode(texts, batch_size=32)
    assert cosines(out, ref).min() >= 0.99999 and np.allclose(out, ref, atol=1e-5)
    modules = json.loads((tmp_path / "modules.json").read_text())
    assert "torch" in modules and not any(m.split(".")[0] == "sentence_transformers" for m in modules)
