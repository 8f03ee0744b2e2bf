"""Settings: built-in defaults, overlaid by a config.toml, validated key by key."""
from __future__ import annotations

import copy
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ingest.backends import CHOICES as BACKEND_CHOICES, MODEL_FREE, cache_dir, has_nvidia_gpu
from ingest.loaders.base import LoaderOptions, OcrOptions
from ingest.model_ref import ModelRef
from ingest.workers.limits import usable_cores

if TYPE_CHECKING:
    from ingest.chunk import ChunkSpec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FORMAT_POOLS = ("txt", "pdf", "ocr", "docx", "pptx")

DEFAULTS: dict[str, Any] = {
    "model": {"name": "default", "backend": "auto", "devices": "auto", "dtype": "auto", "batch_size": "auto",
              "max_batch_tokens": "auto", "compile": False, "tokenizer_workers": "auto", "timeout_s": 300.0,
              "max_attempts": 3, "batch_shapes": "auto", "warm_up": "auto"},
    "chunking": {"chunk_tokens": 200, "overlap_tokens": 30, "context_tokens": 48, "skip_junk": True,
                 "card_context": True},
    "store": {"uri": "./ingest.db", "collection": "documents", "batch_size": 512, "timeout_s": 60.0,
              "writers": "auto"},
    "cache": {"vectors_mb": 512, "path": "auto"},
    "run": {"max_files_in_flight": "auto", "max_chunks_in_flight": "auto", "follow_symlinks": "inside", "report": "",
            "engine": "local"},
    "ray": {"address": "", "cpus": 0, "object_store_mb": 512, "encode_actors": "auto", "encode_gpus": "auto",
            "encode_cpus": 1.0, "writers": 1, "writer_cpus": 0.25,
            "loader_cpus": {"txt": 0.5, "pdf": 1.0, "docx": 0.5, "pptx": 0.5}},
    "limits": {"max_file_mb": 512.0, "max_unzipped_mb": 512.0, "max_text_mb": 64.0, "worker_memory_mb": 4096,
               "max_image_mp": 200.0},
    "loaders": {
        "plugins": [],
        "txt": {"workers": "auto", "timeout_s": 60.0},
        "pdf": {"workers": "auto", "timeout_s": 120.0, "ocr": "auto", "passwords": [], "tables": "auto"},
        "ocr": {"workers": 2, "timeout_s": 60.0, "dpi": 200, "backend": "rapidocr",
                "paddle_model_dir": ""},
        "docx": {"workers": "auto", "timeout_s": 60.0},
        "pptx": {"workers": "auto", "timeout_s": 60.0},
        "legacy": {"convert_timeout_s": 120.0},
    },
}

CHOICES = {
    "model.dtype": ("auto", "float32", "float16", "bfloat16"),
    "model.backend": BACKEND_CHOICES,
    "model.batch_shapes": ("auto", "bounded", "exact"),
    "model.warm_up": ("auto", "always", "never"),
    "loaders.pdf.ocr": ("auto", "always", "never"),
    "loaders.pdf.tables": ("auto", "always", "never"),
    "loaders.ocr.backend": ("rapidocr", "paddleocr"),
    "run.follow_symlinks": ("inside", "all", "none"),
    "run.engine": ("local", "ray"),
}
# integers where 0 is allowed (0 = off)
ZERO_OK = ("chunking.overlap_tokens", "chunking.context_tokens", "cache.vectors_mb", "limits.worker_memory_mb",
           "ray.cpus")
# "auto" or a positive integer
AUTO_INT = ("model.batch_size", "model.max_batch_tokens", "model.tokenizer_workers", "run.max_chunks_in_flight",
            "run.max_files_in_flight", "store.writers",
            "ray.encode_actors", *(f"loaders.{p}.workers" for p in ("txt", "pdf", "docx", "pptx")))
# "auto" loader workers: these on a CPU-only host (the encode workers need the cores); on a host with an
# NVIDIA GPU, or with a backend that runs no model (null, stub), every core loads and tokenizes (the GPU, or
# nothing, encodes), as do "auto" tokenizer workers.
CPU_HOST_WORKERS = {"txt": 1, "pdf": 2, "docx": 1, "pptx": 1}


class ConfigError(ValueError):
    """A bad key or value; the message is one line naming the key."""


def _check(key: str, default: Any, value: Any) -> Any:
    if isinstance(default, bool):
        ok = isinstance(value, bool)
        kind = "true or false"
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
        value = float(value) if ok else value
        kind = "a positive number"
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= (0 if key in ZERO_OK else 1)
        kind = "a non-negative integer" if key in ZERO_OK else "a positive integer"
    elif isinstance(default, list):
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        kind = "a list of strings"
    elif key in AUTO_INT:
        ok = value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1)
        kind = '"auto" or a positive integer'
    elif key == "ray.encode_gpus":
        ok = value == "auto" or (isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0)
        kind = '"auto" or a number of GPUs (0: encode on the CPU)'
    elif key == "model.devices":
        ok = value == "auto" or (isinstance(value, list) and value and all(isinstance(v, str) for v in value))
        kind = '"auto" or a list of devices such as ["cuda:0"]'
    else:
        ok = isinstance(value, str)
        kind = "a string"
    if ok and key in CHOICES and value not in CHOICES[key]:
        ok, kind = False, "one of " + ", ".join(repr(c) for c in CHOICES[key])
    if not ok:
        raise ConfigError(f"config key [{key}] must be {kind}, got {value!r}")
    return value


def _merge(defaults: dict, given: dict, prefix: str) -> dict:
    out = copy.deepcopy(defaults)
    for key, value in given.items():
        dotted = f"{prefix}{key}"
        if key not in defaults:
            raise ConfigError(f"unknown config key [{dotted}]; see config.toml for the valid keys")
        if isinstance(defaults[key], dict):
            if not isinstance(value, dict):
                raise ConfigError(f"config key [{dotted}] must be a table")
            out[key] = _merge(defaults[key], value, dotted + ".")
        else:
            out[key] = _check(dotted, defaults[key], value)
    return out


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Defaults, then the TOML file at `path` (if any), then dotted-key overrides like {"store.uri": ...}."""
    given: dict[str, Any] = {}
    if path is not None:
        try:
            given = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file {path} not found") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    cfg = _merge(DEFAULTS, given, "")
    for dotted, value in (overrides or {}).items():
        *parents, leaf = dotted.split(".")
        table = cfg
        for p in parents:
            table = table[p]
        table[leaf] = _check(dotted, _lookup(DEFAULTS, dotted), value)
    if cfg["chunking"]["overlap_tokens"] >= cfg["chunking"]["chunk_tokens"]:
        raise ConfigError("config key [chunking.overlap_tokens] must be smaller than [chunking.chunk_tokens]")
    every_core = cfg["model"]["backend"] in MODEL_FREE or has_nvidia_gpu()    # no encode worker on the CPU's cores
    for fmt, workers in CPU_HOST_WORKERS.items():
        if cfg["loaders"][fmt]["workers"] == "auto":
            cfg["loaders"][fmt]["workers"] = usable_cores() if every_core else workers
    return cfg


def _lookup(table: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(table, dict) or part not in table:
            raise ConfigError(f"unknown config key [{dotted}]")
        table = table[part]
    return table


def loader_options(cfg: dict[str, Any]) -> LoaderOptions:
    """The settings every format loader reads, from a loaded config."""
    pdf = cfg["loaders"]["pdf"]
    return LoaderOptions(max_text_mb=cfg["limits"]["max_text_mb"], max_unzipped_mb=cfg["limits"]["max_unzipped_mb"],
                         pdf_ocr=pdf["ocr"], passwords=tuple(pdf["passwords"]),
                         convert_timeout_s=cfg["loaders"]["legacy"]["convert_timeout_s"],
                         max_image_mp=cfg["limits"]["max_image_mp"], pdf_tables=pdf["tables"])


def chunk_spec(cfg: dict[str, Any], model: ModelRef) -> ChunkSpec:
    """How the chunker cuts text for `model`, from a loaded config."""
    from ingest.chunk import ChunkSpec      # the chunker's imports (tokenizers, ~0.18 s): not for a search

    ch = cfg["chunking"]
    return ChunkSpec(model.tokenizer_file, model.max_seq_length, ch["chunk_tokens"], ch["overlap_tokens"],
                     ch["context_tokens"], ch["skip_junk"], ch["card_context"])


def ocr_options(cfg: dict[str, Any]) -> OcrOptions:
    """The settings OCR reads, from a loaded config; the cores are shared between the OCR workers."""
    ocr = cfg["loaders"]["ocr"]
    return OcrOptions(dpi=ocr["dpi"], backend=ocr["backend"], paddle_model_dir=ocr["paddle_model_dir"],
                      threads=max(1, (os.cpu_count() or 1) // ocr["workers"]),
                      passwords=tuple(cfg["loaders"]["pdf"]["passwords"]), max_image_mp=cfg["limits"]["max_image_mp"],
                      model_cache=str(cache_dir()))
