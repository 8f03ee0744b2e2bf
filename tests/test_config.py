"""config.toml documents exactly the built-in defaults; bad keys and values name the key."""
from __future__ import annotations

from pathlib import Path

import pytest

from ingest.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parent.parent


def test_config_toml_matches_defaults() -> None:
    assert load_config(ROOT / "config.toml") == load_config(None)


@pytest.mark.parametrize("text, key", [
    ("[model]\nbatchsize = 3\n", "[model.batchsize]"),
    ("[loaders.pdf]\nocr = \"sometimes\"\n", "[loaders.pdf.ocr]"),
    ("[loaders.ocr]\nworkers = 0\n", "[loaders.ocr.workers]"),
    ("[run]\nmax_chunks_in_flight = 0\n", "[run.max_chunks_in_flight]"),
    ("[store]\nwriters = 0\n", "[store.writers]"),
    ("[store]\nwriters = \"many\"\n", "[store.writers]"),
    ("[chunking]\nchunk_tokens = 10\noverlap_tokens = 20\n", "[chunking.overlap_tokens]"),
])
def test_bad_key_or_value_names_the_key(tmp_path: Path, text: str, key: str) -> None:
    (tmp_path / "c.toml").write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "c.toml")
    assert key in str(err.value) and "\n" not in str(err.value)


def test_overrides() -> None:
    cfg = load_config(None, {"store.uri": "http://127.0.0.1:19530", "model.devices": ["cpu", "cpu"]})
    assert cfg["store"]["uri"] == "http://127.0.0.1:19530" and cfg["model"]["devices"] == ["cpu", "cpu"]


def test_auto_writers_follow_the_cores_and_the_stores_own_limit() -> None:
    """[store] writers = "auto" (the default): one process per 4 cores, 1 to 8, for a store that takes several;
    1 for a Milvus server (a `milvus-lite server` takes one writer); a store's own limit over any number."""
    from ingest.store import lancedb, milvus, null, postgres, qdrant
    from ingest.store.writers import writer_processes

    assert load_config(None)["store"]["writers"] == "auto"
    for caps in (lancedb.CAPS, postgres.CAPS, qdrant.SERVER, null.CAPS):
        assert [writer_processes("auto", caps, n) for n in (1, 2, 7, 8, 16, 32, 64, 256)] == [1, 1, 1, 2, 4, 8, 8, 8]
        assert writer_processes(3, caps, 2) == 3
    assert writer_processes("auto", milvus.SERVER, 64) == 1 and writer_processes(6, milvus.SERVER, 2) == 6
    for caps in (milvus.LITE, qdrant.LOCAL):
        assert writer_processes("auto", caps, 64) == 1 and writer_processes(4, caps, 64) == 1
