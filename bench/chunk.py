"""CPU time per chunk of the chunker: before issue 10 (langchain, re-tokenizing every candidate
string) and now (one tokenizer pass per page, from a word cache), on the same texts in the same run.

    python bench/chunk.py [--kb 600] [--repeat 3]

Texts: a long generated text (prose-like paragraphs of 20 to 400 words, some with line breaks),
and the test corpus of tests/test_chunk.py (samples/, documents made by tests/docs.py, generated
hard cases). One thread (TOKENIZERS_PARALLELISM=false, as in the loader workers); CPU seconds
(process_time), best of --repeat. Both give the same chunks (checked here too); "tokenizer pass"
is encode_batch with offsets of the whole text, what the chunker did until issue 29; "word cache"
the same tokens from workers/encode/word_cache.py, as the chunker now gets them (warm: best of --repeat;
"emptied per text": each text's distinct words tokenized, as a loader worker's first file).
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(Path(__file__).parent)]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["TOKENIZERS_PARALLELISM"] = "false"

from ingest.chunk import ChunkSpec, _tokens, page_chunks  # noqa: E402
from ingest.model_ref import resolve_model  # noqa: E402
from pipeline import machine  # noqa: E402
from test_chunk import document_pages, generated, langchain_chunks  # noqa: E402

PROSE = ("the keeper of the lighthouse wrote in his log every evening before the lamp was lit and the ships "
         "passed the rocks in the fog while gulls circled above the harbour and fishermen mended their nets "
         "on the quay as the tide turned slowly towards the north where the cliffs rose steeply over the bay").split()


def long_text(kb: int) -> str:
    rng = random.Random(5)
    paras, size = [], 0
    while size < kb * 1000:
        words = [rng.choice(PROSE) for _ in range(rng.randint(20, 400))]
        para = " ".join(w + ("\n" if rng.random() < 0.01 else "") for w in words).capitalize() + "."
        paras.append(para)
        size += len(para) + 2
    return "\n\n".join(paras)


def cpu(fn, texts: list[str], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        for text in texts:
            fn(text)
        best = min(best, time.process_time() - start)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kb", type=int, default=600, help="size of the long generated text")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    model = resolve_model("default")
    spec = ChunkSpec(model.tokenizer_file, model.max_seq_length, 200, 30)
    tokens = _tokens(spec.tokenizer_file, spec.max_seq_length)

    def tokenizer_pass(text: str) -> None:
        tokens.plain.encode_batch([text.strip()], add_special_tokens=False)[0].offsets

    def word_cache_pass(text: str) -> None:
        tokens.words.tokens(text.strip())

    sets = {"long generated text": [long_text(args.kb)],
            "test corpus": document_pages(Path(tempfile.mkdtemp(prefix="ingest-bench-"))) + generated(1)}
    print(f"machine: {machine()}")
    print(f"spec: {spec.chunk_tokens} tokens, overlap {spec.overlap_tokens}; CPU us per chunk, best of {args.repeat}")
    for name, texts in sets.items():
        old = [langchain_chunks(t, spec)[0] for t in texts]                # also warms both up
        assert old == [list(page_chunks(None, t, spec).chunks) for t in texts], name
        chunks = sum(map(len, old))
        t_old = cpu(lambda t: langchain_chunks(t, spec), texts, args.repeat)
        t_new = cpu(lambda t: page_chunks(None, t, spec), texts, args.repeat)
        t_cold = cpu(lambda t: (tokens.words.clear(), page_chunks(None, t, spec)), texts, args.repeat)
        t_tok = cpu(tokenizer_pass, texts, args.repeat)
        t_words = cpu(word_cache_pass, texts, args.repeat)       # warm: the first repeat filled the cache
        print(f"{name}: {sum(map(len, texts)):,} characters, {chunks} chunks")
        print(f"  old (langchain length_function): {t_old / chunks * 1e6:8.0f} us/chunk")
        print(f"  new (word cache, warm):          {t_new / chunks * 1e6:8.0f} us/chunk   "
              f"({t_old / t_new:.1f}x faster, ids included)")
        print(f"  new, word cache emptied per text: {t_cold / chunks * 1e6:7.0f} us/chunk")
        print(f"  tokenizer pass alone:            {t_tok / chunks * 1e6:8.0f} us/chunk")
        print(f"  the same from the word cache:    {t_words / chunks * 1e6:8.0f} us/chunk")


if __name__ == "__main__":
    main()
