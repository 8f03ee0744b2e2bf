"""Issue 21, items 4 and 7: dense, BM25 and hybrid search (`ingest search --mode`), what a hit returns,
and stores made before schema 2 (searchable; a run refuses them until --reembed upgrades them).
Rows are built with Store.upsert_columns and the real model's vectors; searches run the real CLI."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import cli_env, ingest, run, store_rows
from ingest.model_ref import resolve_model
from ingest.search import QueryEncoder
from ingest.store import Store
from ingest.store.schema import Columns

PART = "ZX4471Q"
# A parts list whose codes look alike to the embedding (dense ranks the target 8th), and the one passage
# that names the part, in passing, in a text about something else: only BM25's exact token finds it.
TEXTS = [f"Pump kit {code}." for code in ("ZX4471P", "ZX4471R", "ZX4471", "ZX4477Q", "ZX4411Q", "ZX4471S",
                                          "XZ4471Q")] + [
    "Quarterly safety audit of the north plant: the inspectors walked the loading docks, checked the fire exits "
    "and the first-aid stations, reviewed training records for forklift drivers, and noted one leaking valve on "
    f"line three, since fixed with a seal from kit {PART}.",
    "Revenue for fiscal 2019 grew 8 percent to 6.5 billion dollars, driven by subscriptions.",
    "The lighthouse keeper climbs the spiral stairs every evening to light the lamp.",
]
TARGET = TEXTS.index(next(t for t in TEXTS if PART in t))


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    return QueryEncoder("default", "torch").embed(TEXTS)


def columns(texts: list[str], vectors: np.ndarray) -> Columns:
    n = len(texts)
    return Columns([f"id{i}" for i in range(n)], vectors, texts, ["docs/catalog.pdf"] * n, [i + 1 for i in range(n)],
                   list(range(n)), ["pdf"] * n, ["h1"] * n, ["Parts Catalog 2024"] * n, ["Pumps > Kits"] * n,
                   ["table" if i == TARGET else "text" for i in range(n)],
                   ["10.5,20,300.25,40" if i == TARGET else "" for i in range(n)],
                   [f"Parts Catalog 2024 > Pumps > Kits\n{t}" for t in texts])


def build(uri: str, collection: str, vectors: np.ndarray) -> None:
    store = Store(uri, collection)
    try:
        model = resolve_model("default")
        store.ensure_collection(model.name, model.dim, "torch")
        store.upsert_columns(columns(TEXTS, vectors))
        store.flush()
    finally:
        store.close()


def search(work: Path, query: str, *extra: str) -> tuple[list[dict], str]:
    res = ingest("search", query, "--json", "--store", str(work / "store.db"), *extra, cwd=work)
    assert res.rc == 0, res.stderr
    return json.loads(res.stdout), res.stderr


def ranks(hits: list[dict]) -> list[int]:
    return [h["chunk"] for h in hits]


@pytest.mark.slow
def test_bm25_finds_a_rare_token_dense_misses(work: Path, vectors: np.ndarray) -> None:
    build(str(work / "store.db"), "documents", vectors)
    dense, _ = search(work, PART, "--mode", "dense", "-k", "3")
    bm25, _ = search(work, PART, "--mode", "bm25", "-k", "3")
    hybrid, _ = search(work, PART, "--mode", "hybrid", "-k", "3")
    default, _ = search(work, PART, "-k", "3")
    assert TARGET not in ranks(dense)                    # every code looks alike to the embedding
    assert ranks(bm25)[0] == TARGET and bm25[0]["score"] > 0
    assert TARGET in ranks(hybrid) and ranks(default) == ranks(dense)
    hit = bm25[0]
    assert hit == {"score": hit["score"], "source": "docs/catalog.pdf", "page": TARGET + 1, "chunk": TARGET,
                   "text": TEXTS[TARGET], "title": "Parts Catalog 2024", "headings": "Pumps > Kits",
                   "element": "table", "bbox": [10.5, 20.0, 300.25, 40.0]}
    assert all(h["bbox"] is None for h in dense)
    # a question in words: dense finds the revenue line first
    assert ranks(search(work, "how much money did the company make last year", "--mode", "dense", "-k", "1")[0]) \
        == [TEXTS.index(next(t for t in TEXTS if "Revenue" in t))]

    plain = ingest("search", PART, "--mode", "bm25", "-k", "2", "--store", str(work / "store.db"), cwd=work)
    assert plain.rc == 0, plain.stderr
    first = plain.stdout.splitlines()[:2]
    assert first[0].startswith(" 1. ") and f"docs/catalog.pdf  p.{TARGET + 1}  Parts Catalog 2024  [Pumps > Kits]" \
        in first[0], plain.stdout
    assert first[1].strip() == TEXTS[TARGET][:200] + "..."                # the text's first 200 characters


def test_server_answers_every_mode(milvus_uri: str, vectors: np.ndarray) -> None:
    """milvus-lite server (a server URI): the same schema, BM25 function and hybrid search."""
    build(milvus_uri, "search_modes", vectors)
    store = Store(milvus_uri, "search_modes")
    try:
        assert store.schema() == (2, True)
        query = QueryEncoder("default", "torch").embed([PART])[0].tolist()
        assert [h["chunk"] for h in store.search(None, 1, "bm25", PART)] == [TARGET]
        assert TARGET in [h["chunk"] for h in store.search(query, 3, "hybrid", PART)]
    finally:
        store.drop()
        store.close()


# -- stores made before schema 2 -----------------------------------------------------------------
_V1 = """
import sys, numpy as np
from pymilvus import DataType, MilvusClient
from ingest.store import Store
uri, model, dim, texts = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
vectors = np.load(uri + ".npy")
store = Store(uri, "documents")
# The schema of b08e35e's Store.ensure_collection, with its properties (no ingest.schema).
schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=64)
schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
schema.add_field("text", DataType.VARCHAR, max_length=65535)
schema.add_field("source", DataType.VARCHAR, max_length=4096)
schema.add_field("page", DataType.INT64)
schema.add_field("chunk", DataType.INT64)
schema.add_field("format", DataType.VARCHAR, max_length=16)
schema.add_field("file_hash", DataType.VARCHAR, max_length=64)
index = store.client.prepare_index_params()
index.add_index("vector", index_type="FLAT", metric_type="COSINE")
store.client.create_collection("documents", schema=schema, index_params=index,
                               properties={"ingest.model": model, "ingest.dim": str(dim), "ingest.backend": "torch"})
store.client.insert("documents", [{"id": f"old{i}", "vector": v.tolist(), "text": t, "source": "old.txt", "page": 0,
                                   "chunk": i, "format": "txt", "file_hash": "h0"} for i, (t, v) in enumerate(zip(texts, vectors))])
store.flush()
store.close()
"""


def make_v1_store(work: Path, texts: list[str], vectors: np.ndarray) -> None:
    """A collection as b08e35e made it, in work/store.db (in a subprocess: Milvus Lite locks its file)."""
    model = resolve_model("default")
    np.save(str(work / "store.db") + ".npy", vectors)
    proc = subprocess.run([sys.executable, "-c", _V1, str(work / "store.db"), model.name, str(model.dim), *texts],
                          capture_output=True, text=True, env=cli_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_old_store_searchable_refused_then_upgraded(work: Path, vectors: np.ndarray) -> None:
    make_v1_store(work, TEXTS, vectors)
    hits, note = search(work, "the lighthouse lamp", "--mode", "hybrid", "-k", "1")   # dense answers, with a note
    assert hits[0]["text"] == TEXTS[-1] and hits[0]["title"] == "" and hits[0]["bbox"] is None
    assert "older ingest" in note and "--reembed" in note and len(note.strip().splitlines()) == 1
    assert search(work, "the lighthouse lamp", "--mode", "dense", "-k", "1")[1] == ""

    (work / "docs" / "new.txt").write_text(f"A new note about part {PART} and the lighthouse.\n")
    refused = run(work / "docs", work, "--backend", "null")
    assert refused.rc == 2
    line = refused.stderr.strip().splitlines()[-1]
    assert "--reembed" in line and "upgrade" in line and "nothing was changed" in line, refused.stderr
    assert sorted(r["id"] for r in store_rows(work)) == [f"old{i}" for i in range(len(TEXTS))]

    upgraded = run(work / "docs", work, "--backend", "null", "--reembed")
    assert upgraded.rc == 0, upgraded.stderr
    assert [r["source"] for r in store_rows(work)] == ["new.txt"]
    bm25, note = search(work, PART, "--mode", "bm25", "-k", "1")      # a null collection still has BM25
    assert note == "" and bm25[0]["source"] == "new.txt"
