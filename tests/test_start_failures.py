"""Issue 20 items 10-12: a run that cannot start still writes a true report (what stopped it, the exit
code); `ingest search` on a store or collection that does not exist says so in one line and creates
nothing; the Ray driver's collection gets the model's own embedding dimension (a Dense layer's)."""
from __future__ import annotations

import fcntl
import json
from pathlib import Path

import pytest

from conftest import ingest, ray_config, run, run_on, server_rows
from ingest.store import Store

NULL = ["--backend", "null"]


def stopped(res, why: str) -> dict:
    """The report of a run that could not start: exit 2, no files, `why` in stopped_by and in the one line."""
    assert res.rc == 2, res.stderr
    assert res.stderr.count("\n") == 1 and why in res.stderr, res.stderr
    assert res.report is not None, "no report written"
    totals = res.report["totals"]
    assert res.report["files"] == [] and totals["exit_code"] == 2 and why in totals["stopped_by"], totals
    return totals


@pytest.mark.slow
def test_a_run_that_cannot_start_replaces_the_last_report(work: Path) -> None:
    (work / "docs" / "a.txt").write_text("Otters hold hands while they sleep so they do not drift apart.")
    first = run(work / "docs", work, *NULL)
    assert first.rc == 0 and first.report["totals"]["exit_code"] == 0, first.stderr
    with open(work / "store.db.lock", "a+") as lock:              # another process holds the store
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        totals = stopped(run(work / "docs", work, *NULL), "is in use by")
    assert totals["store"] == str(work / "store.db") and totals["interrupted"] is False
    stopped(run(work / "docs", work, *NULL, config="[chunking]\nchunk_tokens = 100\n"), "settings changed")
    stopped(run(work / "docs", work, *NULL, config='[loaders]\nplugins = ["no_such_plugin_h4"]\n'),
            "failed to import")
    (work / "config.toml").unlink()
    stopped(run(work / "docs", work, "--model", str(work / "no-model")), "model")
    again = run(work / "docs", work, *NULL)
    assert again.rc == 0 and again.report["totals"]["exit_code"] == 0, again.stderr
    assert again.report["totals"]["by_status"] == {"unchanged": 1}


def test_bad_config_or_folder_writes_the_report_where_it_is_known(work: Path) -> None:
    stopped(run(work / "docs", work, *NULL, config="[store]\nbogus = 1\n"), "unknown config key [store.bogus]")
    stopped(run(work / "missing", work, *NULL), "folder")
    # No --report: beside the store, whose URI is --store, or the [store] uri of a config that does not load.
    res = ingest("run", "docs", "--store", "given.db", "--quiet", cwd=work, config="[run]\nengine = 3\n")
    assert res.rc == 2 and json.loads((work / "given.db.report.json").read_text())["totals"]["exit_code"] == 2
    res = ingest("run", "docs", "--quiet", cwd=work, config='[store]\nuri = "named.db"\nbogus = 1\n')
    assert res.rc == 2 and "bogus" in json.loads((work / "named.db.report.json").read_text())["totals"]["stopped_by"]
    assert not (work / "given.db").exists() and not (work / "named.db").exists()


def test_search_on_a_store_or_collection_that_does_not_exist(work: Path, milvus_uri: str) -> None:
    before = sorted(p.name for p in work.iterdir())
    res = ingest("search", "otters", "--store", "nothing.db", cwd=work)
    assert (res.rc, res.stderr.count("\n")) == (2, 1) and "no store at nothing.db" in res.stderr, res.stderr
    assert sorted(p.name for p in work.iterdir()) == before              # no .db, no .lock, no manifest
    res = ingest("search", "otters", "--store", milvus_uri, "--collection", "h4_never_made", cwd=work)
    assert (res.rc, res.stderr.count("\n")) == (2, 1), res.stderr
    assert "no collection 'h4_never_made'" in res.stderr, res.stderr
    assert server_rows(milvus_uri, "h4_never_made") == []


@pytest.fixture(scope="module")
def dense_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real sentence-transformers model with a Dense layer (384 -> 128) after the packaged model's pooling."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize

    from ingest.model_ref import resolve_model

    base = SentenceTransformer(resolve_model().path, device="cpu")
    model = SentenceTransformer(modules=[base[0], base[1], Dense(384, 128), Normalize()], device="cpu")
    assert model.get_embedding_dimension() == 128
    path = tmp_path_factory.mktemp("dense") / "minilm-dense-128"
    model.save(str(path))
    return path


def test_model_dimension_is_the_sentence_embeddings(dense_model: Path, tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    from ingest.model_ref import resolve_model

    assert resolve_model().dim == 384
    assert resolve_model(str(dense_model)).dim == 128
    base = SentenceTransformer(resolve_model().path, device="cpu")
    two = SentenceTransformer(modules=[base[0], Pooling(384, pooling_mode=("mean", "max"))], device="cpu")
    two.save(str(tmp_path / "two-poolings"))
    assert resolve_model(str(tmp_path / "two-poolings")).dim == two.get_embedding_dimension() == 768


def test_ray_engine_with_a_dense_model(dense_model: Path, milvus_uri: str, ray_address: str, work: Path) -> None:
    (work / "docs" / "a.txt").write_text("Otters hold hands while they sleep so they do not drift apart.")
    res = run_on(milvus_uri, "h4_dense", work, "--model", str(dense_model), "--backend", "torch",
                 config=ray_config(ray_address))
    assert res.rc == 0, (res.stderr, res.report and res.report["totals"])
    assert res.by_path()["a.txt"]["status"] == "ingested" and len(server_rows(milvus_uri, "h4_dense")) == 1
    store = Store(milvus_uri, "h4_dense")
    try:
        assert store.recorded() == (str(dense_model), 128, "torch")
    finally:
        store.close()
