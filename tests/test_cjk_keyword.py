"""Issue 46, item 4: keyword search in every script. A Chinese, a Japanese and a Korean phrase of 2-6
characters from inside a longer run, typed with no spaces, is found first by bm25 and by hybrid on every store
(Milvus Lite, a Milvus server, PostgreSQL, Qdrant's local mode, LanceDB), and English still is: seven short
files (bench/cjk_keyword.py's) through the real `ingest run` with the default model, searched through
`ingest search` (the CLI, one phrase a store and mode) and its `Searcher` (every phrase). And the rule itself
(ingest/store/cjk.py): runs of CJK characters as overlapping bigrams, nothing else changed."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from conftest import TESTS, ingest
from ingest.search import QueryEncoder, Searcher
from ingest.store.cjk import bigrams, pairs
from ingest.store.rows import Row, search_text

_spec = importlib.util.spec_from_file_location("cjk_keyword", TESTS.parent / "bench" / "cjk_keyword.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)             # the corpus and phrases (bench/ is not put on sys.path)
CORPUS, PHRASES, LONG, LATIN = bench.CORPUS, bench.PHRASES, bench.LONG, bench.LATIN

STORES = ("milvus-lite", "milvus-server", "postgresql", "qdrant-local", "lancedb")
COLLECTION = "cjk_keyword"
# the phrase each store is asked through the CLI (every script, a long and a short phrase, over the stores)
CLI_PHRASE = dict(zip(STORES, (LONG[0], PHRASES[5], PHRASES[10], LONG[1], LONG[2])))
ENCODERS: dict[str, QueryEncoder] = {}      # the query encoder of each backend, shared by the stores' searches


def test_runs_of_cjk_characters_become_overlapping_bigrams() -> None:
    assert bigrams("東京タワー") == "東京 京タ タワ ワー" and bigrams("中文") == "中文" and bigrams("字") == "字"
    assert bigrams("한국어 문장입니다") == "한국 국어 문장 장입 입니 니다"
    assert bigrams("iPhone手机。第1章") == "iPhone 手机 。 第 1 章"          # set apart from what it touches
    assert bigrams("ｶﾀｶﾅ 々〆〇") == "ｶﾀ ﾀｶ ｶﾅ 々〆 〆〇"                      # half-width Kana, iteration marks
    assert bigrams("𠀋𠀍𠀎") == "𠀋𠀍 𠀍𠀎"                                    # beyond the BMP (extension B)
    assert bigrams("東京・大阪") == "東京 ・ 大阪"                              # the middle dot parts runs
    assert pairs("日本語") == ["日本", "本語"] and pairs("字") == ["字"]
    for text in ("東京タワー", "iPhone手机。第1章", "한국어 문장입니다", "極端な天気"):
        assert bigrams(bigrams(text)) == bigrams(text)                      # idempotent: a query rewritten twice
    latin = "Ｆｕｌｌ-width CAFÉ, naïve Straße — Ωmega ∑ 1.5 ×2\nnext line"
    plain = "ascii only: the spiral stairs"
    assert bigrams(latin) == latin and bigrams(plain) is plain                # no CJK: nothing changes


def test_search_text_holds_bigrams_and_latin_rows_are_unchanged() -> None:
    row = Row(1, "The spiral stairs, café naïve.", "Title", "A > B", "text", "", "doc.pdf > Title > A > B")
    assert search_text(row) == f"{row.context}\n{row.text}"                 # a Latin row: as before
    cjk = row._replace(text="東京の老舗では伝統的な技術", context="寿司.pdf > 寿司職人")
    assert search_text(cjk) == "寿司 .pdf > 寿司 司職 職人\n東京 京の の老 老舗 舗で では は伝 伝統 統的 的な な技 技術"


@pytest.fixture(scope="module", params=STORES)
def ingested(request, tmp_path_factory) -> tuple[str, str, Path]:
    """(store, uri, work folder) of a store holding the seven files, ingested with the defaults."""
    store = request.param
    work = tmp_path_factory.mktemp(store)
    bench.write_corpus(work / "docs")
    uri = {"milvus-lite": lambda: str(work / "store.db"),
           "milvus-server": lambda: request.getfixturevalue("milvus_uri"),
           "postgresql": lambda: request.getfixturevalue("pg_server").database(COLLECTION),
           "qdrant-local": lambda: f"qdrant://{work / 'qdrant'}",
           "lancedb": lambda: f"lancedb://{work / 'lance'}"}[store]()
    res = ingest("run", "docs", "--store", uri, "--collection", COLLECTION, "--report", "report.json", "--quiet",
                 cwd=work)
    assert res.rc == 0, res.stderr
    assert res.report["totals"]["by_status"] == {"ingested": len(CORPUS)}
    return store, uri, work


@pytest.mark.slow
def test_each_script_found_first_by_bm25_and_hybrid(ingested) -> None:
    store, uri, work = ingested
    phrase, name = CLI_PHRASE[store]
    for mode in ("bm25", "hybrid"):                       # the CLI, as a user types the phrase
        res = ingest("search", phrase, "--mode", mode, "--json", "-k", "3", "--store", uri, "--collection",
                     COLLECTION, cwd=work)
        assert res.rc == 0, res.stderr
        hits = json.loads(res.stdout)
        assert hits and Path(hits[0]["source"]).name == name, (store, mode, phrase, [h["source"] for h in hits])
    asked = PHRASES + LONG + LATIN
    with Searcher(uri, COLLECTION) as searcher:           # every phrase, through what `ingest search` calls
        searcher.encoder = ENCODERS.setdefault(searcher.backend, searcher.encoder)     # the model loaded once
        for mode in ("bm25", "hybrid"):
            found = searcher.search([p for p, _ in asked], 3, searcher.mode(mode)[0])
            missed = [p for (p, name), hits in zip(asked, found) if not hits or Path(hits[0]["source"]).name != name]
            assert not missed, (store, mode, missed)
