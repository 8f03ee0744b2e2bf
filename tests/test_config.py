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
