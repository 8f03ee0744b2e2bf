"""Issue 10: the chunker tokenizes each page once, gives langchain's chunks exactly and the encode
pool's token ids; a big file's chunking is split over its pool's workers, in order."""
from __future__ import annotations

import json
from dataclasses import replace
import random
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

from conftest import cli_env, run
from docs import make_docx, make_pdf, make_pptx
from ingest.workers.encode import word_cache as word_tokens
from ingest.chunk import MAX_CHUNK_BYTES, WHITESPACE, ChunkSpec, _tokens, page_chunks
from ingest.config import load_config, loader_options
from ingest.files import FileRef
from ingest.load import RANGE_BYTES, Loaded, LoadTask, Pages, Range, load_file
from ingest.sections import Doc
from ingest.loaders import loader_for
from ingest.model_ref import resolve_model
from ingest.sniff import detect_format
from ingest.workers.encode._tokenize import load_tokenizer
from ingest.workers.failure import Failure

ROOT = Path(__file__).resolve().parent.parent
MODEL = resolve_model("default")
SPECS = [ChunkSpec(MODEL.tokenizer_file, MODEL.max_seq_length, 200, 30),
         ChunkSpec(MODEL.tokenizer_file, MODEL.max_seq_length, 40, 12),
         ChunkSpec(MODEL.tokenizer_file, MODEL.max_seq_length, 1000, 0)]


# -- the reference: the chunker before issue 10 (langchain with a re-tokenizing length_function) ----
@lru_cache(maxsize=8)
def _plain(path: str):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(path)
    tok.no_truncation()
    tok.no_padding()
    return tok


@lru_cache(maxsize=8)
def _splitter(spec: ChunkSpec):
    from langchain_text_splitters import RecursiveCharacterTextSplitter

    tok = _plain(spec.tokenizer_file)
    return RecursiveCharacterTextSplitter(
        chunk_size=spec.limit, chunk_overlap=min(spec.overlap_tokens, spec.limit // 2),
        length_function=lambda t: len(tok.encode(t, add_special_tokens=False).ids))


def langchain_chunks(text: str, spec: ChunkSpec) -> tuple[list[str], int]:
    """(chunks, cut) as the old split_text and page_chunks made them."""
    text, tok, out = text.strip(), _plain(spec.tokenizer_file), []
    for chunk in _splitter(spec).split_text(text) if text else []:
        enc = tok.encode(chunk, add_special_tokens=False)
        if len(enc.ids) <= spec.limit:
            out.append(chunk)
            continue
        for start in range(0, len(enc.ids), spec.limit):
            offs = enc.offsets[start:start + spec.limit]
            if piece := chunk[offs[0][0]:offs[-1][1]].strip():
                out.append(piece)
    chunks, cut = [], 0
    for chunk in out:
        if len(chunk.encode()) <= MAX_CHUNK_BYTES:
            chunks.append(chunk)
            continue
        cut, data = cut + 1, chunk.encode()
        while data:
            piece = data[:MAX_CHUNK_BYTES].decode(errors="ignore")
            chunks.append(piece)
            data = data[len(piece.encode()):]
    return chunks, cut


# -- the corpus ---------------------------------------------------------------------------------
WORDS = ("the lighthouse keeper logs every passing ship before dawn while gulls circle ÉCOLE Ürün ÅSA naïve "
         "résumé https://example.com/path/to/page?query=1&b=2#frag user@example.org 東京タワー 長江是亞洲最長的河流 "
         "😀🚀 👩‍👩‍👧 [MASK] [SEP]x tab\there ctl\x0bmid \x85nel \x1cfs\x1d nbsp\xa0word \u3000ideo zero\u200bwidth "
         "\x00nul \ufffdrepl 3.14159 e=mc² −42 ﬁnance Ⅻ").split(" ")


def generated(seed: int) -> list[str]:
    """Texts with long paragraphs, lines longer than a chunk, long words, CJK, control characters..."""
    rng = random.Random(seed)

    def para(n: int) -> str:
        words = [rng.choice(WORDS) for _ in range(n)]
        for _ in range(n // 25):
            words[rng.randrange(n)] += rng.choice(["\n", ".\n", "\t", "  ", " \n \n"])
        return " ".join(words)

    texts = ["", "   \n\n \t ", "word", "x" * 300, "a" * 70_000 + " tail", "東" * 3000,
             "長江是亞洲最長的河流，" * 200 + "\n\n" + "ＡＢＣ" * 100, "\u3000\u3000" + "第一章。" * 300,
             " ".join(["https://example.com/" + "seg/" * 100] * 3), "\n".join(para(400) for _ in range(3)),
             para(2000).replace("\n", " "), "\x00\x01\x02 \x7f" * 50, "😀" * 600]
    for _ in range(12):
        paras = [para(rng.choice([1, 8, 60, 250, 900])) for _ in range(rng.randint(1, 25))]
        texts.append(rng.choice(["\n\n", "\n", "\n\n\n", " \n\n ", "\r\n\r\n"]).join(paras))
    return texts


def document_pages(folder: Path) -> list[str]:
    """The text pages of samples/ and of documents made by tests/docs.py (nothing that needs OCR)."""
    rng = random.Random(7)
    long = " ".join(rng.choice(WORDS[:20]) for _ in range(1500))
    make_pdf(folder / "report.pdf", ["Introduction to the annual report.", long, "Ünïcödé and 東京 on page 3."])
    make_docx(folder / "memo.docx", [long[:3000], "Second paragraph.", long[3000:]], heading="Workshop memo",
              table_rows=[["Item", "Count"], ["Violin", "3"]], header="Company header", footer="Page footer")
    make_pptx(folder / "deck.pptx", [{"title": "Farming", "body": long[:2000], "notes": "Speaker notes here."},
                                     {"title": "Second", "body": "A short slide."}])
    paths = [p for p in sorted((ROOT / "samples").iterdir()) if p.suffix not in (".doc", ".ppt", ".png")]
    options = loader_options(load_config())
    pages = []
    for path in [*paths, *sorted(folder.iterdir())]:
        pages += [p.text for p in loader_for(detect_format(path))(path, options) if not p.needs_ocr]
    return pages


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return document_pages(tmp_path_factory.mktemp("corpus")) + generated(1)


def check_same(texts: list[str], spec: ChunkSpec) -> int:
    """Assert the chunker gives the reference's chunks and the encode pool's ids; the chunks checked."""
    exact = load_tokenizer(spec.tokenizer_file, spec.max_seq_length)[0]
    total = 0
    for text in texts:
        expected, cut = langchain_chunks(text, spec)
        got = page_chunks(3, text, spec, "title", 2)
        assert list(got.chunks) == expected, text[:200]
        assert (got.page, got.title, got.segment, got.cut) == (3, "title", 2, cut)
        assert got.ids.dtype == got.lengths.dtype == "int32" and len(got.lengths) == len(expected)
        assert int(got.lengths.sum()) == len(got.ids)
        starts = [0, *got.lengths.cumsum().tolist()]
        for chunk, a, b in zip(got.chunks, starts, starts[1:]):
            assert got.ids[a:b].tolist() == exact.encode(chunk).ids, chunk[:200]
        total += len(expected)
    return total


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.chunk_tokens}-{s.overlap_tokens}")
def test_chunks_and_ids_match_langchain_and_the_encode_pool(corpus: list[str], spec: ChunkSpec) -> None:
    assert _tokens(spec.tokenizer_file, spec.max_seq_length).additive
    assert check_same(corpus, spec) > 100


def trained_tokenizer(path: Path, kind: str) -> str:
    """A small BPE tokenizer that is not additive over whitespace (Metaspace or byte-level), trained here."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    if kind == "metaspace":
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet() if kind == "bytelevel" else [])
    tok.train_from_iterator(generated(2), trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[
        ("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))])
    tok.save(str(path))
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["metaspace", "bytelevel"])
def test_a_tokenizer_that_is_not_additive_is_tokenized_for_real(tmp_path: Path, corpus: list[str],
                                                                 kind: str) -> None:
    spec = ChunkSpec(trained_tokenizer(tmp_path / "tokenizer.json", kind), 96, 60, 10)
    assert not _tokens(spec.tokenizer_file, spec.max_seq_length).additive
    assert check_same(corpus[-12:], spec) > 50


# -- segments -------------------------------------------------------------------------------
def test_word_cache_gives_the_tokens_of_the_whole_text(corpus: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 29: a page's tokens from the word cache are encode_batch's on the whole page (ids and starts),
    also for odd whitespace (deleted controls, NBSP, ideographic space) and after the
    cache is emptied."""
    tokens = _tokens(MODEL.tokenizer_file, MODEL.max_seq_length)
    rng = random.Random(3)
    odd = [" ", "\n", "\t", "\x0b", "\x0c", "\x1c", "\x1f", "\x85", "\xa0", "\u3000", "\u200b", "\x00", ""]
    texts = corpus + ["".join(rng.choice(WORDS) + rng.choice(odd) for _ in range(rng.randint(0, 300))) for _ in range(60)]
    monkeypatch.setattr(word_tokens, "MAX_WORDS", 50)
    cache = word_tokens.WordTokens(tokens.plain, WHITESPACE)
    for text in texts:
        ids, starts = cache.tokens(text)
        enc = tokens.plain.encode_batch([text], add_special_tokens=False)[0]
        assert ids.tolist() == enc.ids and starts.tolist() == [o[0] for o in enc.offsets], repr(text[:200])
        assert ids.dtype == "int32" and starts.dtype == "int64"
    assert len(cache._index) < len({w for t in texts for w in t.split()})


def test_pages_hand_on_parts_in_order_and_a_failed_range_fails_the_file() -> None:
    spec, ref = SPECS[0], FileRef(0, "a.txt", "/nowhere/a.txt", fmt="txt")
    ranges = (Range(1, 10, 20), Range(2, 20, 30))
    first = Loaded("hash", (page_chunks(None, "part one", spec),), (), 0.5, ranges=ranges, doc=Doc("a.txt", "a.txt"))
    part = {n: Loaded("", (page_chunks(None, text, spec),), (), 0.1) for n, text in ((1, "part two"), (2, "part three"))}
    pages = Pages(ref, first, "old")
    assert [pages.next_range().part for _ in ranges] == [1, 2]
    got = pages.ready()                                                 # part 0 is ready at once
    pages.add_part(2, part[2])                                          # out of order, as tasks may end
    assert len(got) == 1 and not got[0].last and pages.ready() == []
    pages.add_part(1, part[1])
    got += pages.ready()
    assert [(f.start, f.last, [r.text for r in f.chunk_texts()]) for f in got] == [
        (0, False, ["part one"]), (1, False, ["part two"]), (2, True, ["part three"])]
    assert got[-1].outcome.status == "ingested" and got[-1].outcome.chunks == 3 and got[-1].record

    pages = Pages(ref, first, "old")
    for _ in ranges:
        pages.next_range()
    pages.ready()
    pages.add_part(1, Failure("txt loader", "timeout after 60 s"))
    (done,) = pages.ready()
    assert done.last and done.outcome.status == "failed" and done.old_hash == "old" and done.start == 1
    assert done.outcome.error == "loading bytes 10-20 failed: timeout after 60 s" and pages.ready() == []


def big_text(paragraphs: int) -> str:
    """Numbered paragraphs, mostly words over 100 letters (one [UNK] token each: cheap to encode)."""
    rng = random.Random(3)
    return "\n\n".join(f"para{i:05d} " + " ".join(rng.choice(WORDS[:12]) for _ in range(8)) + " "
                       + " ".join(rng.choice("abcdefgh") * 120 for _ in range(20)) for i in range(paragraphs))


PARAGRAPHS = 800
STORED_ROWS = """
import json, sys
from ingest.store import Store
print(json.dumps(Store(sys.argv[1], "documents").rows(["source", "page", "chunk", "text"])))
"""


@pytest.mark.slow
def test_a_big_file_is_chunked_in_several_tasks_in_order(work: Path) -> None:
    path = work / "docs" / "big.txt"
    path.write_text(big_text(PARAGRAPHS), encoding="utf-8")             # ~2 MB
    spec = ChunkSpec(MODEL.tokenizer_file, MODEL.max_seq_length, 200, 30)
    task = LoadTask(str(path), "txt", loader_options(load_config()), spec, source="big.txt")
    loaded = load_file(task)
    assert path.stat().st_size > RANGE_BYTES and len(loaded.ranges) >= 1
    expected = [c for p in loaded.pages for c in p.chunks]
    for part in loaded.ranges:
        done = load_file(replace(task, doc=loaded.doc, range=part))
        expected += [c for p in done.pages for c in p.chunks]

    res = run(work / "docs", work, config='[model]\nbackend = "torch"\n[loaders.txt]\nworkers = 2\n')
    assert res.rc == 0, res.stderr
    assert res.by_path()["big.txt"]["chunks"] == len(expected)
    proc = subprocess.run([sys.executable, "-c", STORED_ROWS, str(work / "store.db")], capture_output=True,
                          text=True, env=cli_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = sorted(json.loads(proc.stdout.strip().splitlines()[-1]), key=lambda r: r["chunk"])
    assert [r["chunk"] for r in rows] == list(range(len(expected)))
    assert [r["text"] for r in rows] == expected
    numbers = [int(n) for r in rows for n in re.findall(r"para(\d{5})", r["text"])]
    assert numbers == sorted(numbers) and set(numbers) == set(range(PARAGRAPHS))
