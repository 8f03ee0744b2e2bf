"""Export a local sentence-transformers model to ONNX (fp32 and dynamic int8), once, with an accuracy guard.

Runs as its own process (`python -m ingest.onnx_export MODEL_DIR OUT_DIR`), started by
`ingest.backends`: it is the one place that imports torch for the ONNX backends, so the
processes that only use the export never do. Nothing is downloaded.

The graph is the whole SentenceTransformer (transformer, pooling, any dense layers) traced
with eager attention, which ONNX Runtime fuses and quantizes best (measured: sdpa attention
exported 0.8x torch, eager 1.0x). Inputs input_ids and attention_mask (int64, batch x
tokens); output sentence_embedding (float32, not normalized).

int8 is ONNX Runtime's dynamic quantization, per channel, run one text a call so that a text's
activation scales are its own (workers/encode/onnx_model.py NOTE: int8). Recipes are tried fastest first
for this CPU and the first that passes the guard is kept: with VNNI (avx512_vnni, avx_vnni)
s8 weights; without it s8 weights with reduce_range (AVX2's u8 x s8 products saturate
without it), then u8 weights. The guard embeds the fixed probe texts (probe_texts.json) with
torch fp32 and with the export: fp32 must reach cosine min >= 0.9999, int8 mean >= 0.99 and
min >= 0.97. OpenVINO runs the fp32 file in the precision it picks for this CPU (bfloat16 with
AMX) and must pass the fp32 guard. What passed or failed, and each backend's chunks/s on the
probes, is written to export.json (`auto` chooses by it); files appear by os.replace.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

FP32_MIN = 0.9999
INT8_MEAN, INT8_MIN = 0.99, 0.97
PROBES = Path(__file__).with_name("probe_texts.json")


def cpu_has_vnni() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags


def int8_recipes() -> list[tuple[str, dict]]:
    """(name, quantize_dynamic keywords), fastest first for this CPU."""
    from onnxruntime.quantization import QuantType

    s8 = ("s8", dict(weight_type=QuantType.QInt8))
    s8_rr = ("s8-reduce-range", dict(weight_type=QuantType.QInt8, reduce_range=True))
    u8 = ("u8", dict(weight_type=QuantType.QUInt8))
    return [s8, s8_rr] if cpu_has_vnni() else [s8_rr, u8]


def _export_fp32(model, path: Path) -> None:
    import torch

    class Graph(torch.nn.Module):
        def __init__(self, st):
            super().__init__()
            self.st = st

        def forward(self, input_ids, attention_mask):
            features = {"input_ids": input_ids, "attention_mask": attention_mask,
                        "token_type_ids": torch.zeros_like(input_ids)}
            return self.st(features)["sentence_embedding"]

    ids = torch.ones((2, 16), dtype=torch.long)
    axes = {"input_ids": {0: "batch", 1: "tokens"}, "attention_mask": {0: "batch", 1: "tokens"},
            "sentence_embedding": {0: "batch"}}
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Graph(model).eval(), (ids, torch.ones_like(ids)), str(path), dynamo=False,
                          input_names=["input_ids", "attention_mask"], output_names=["sentence_embedding"],
                          dynamic_axes=axes, opset_version=17)


def _check(model_file: Path, runtime: str, ref, texts: list[str], reference, one_row: bool = False) -> dict:
    """Cosine against torch on the probe texts (sorted by length), and chunks/s (best of 3 passes,
    batches of 16 padded to their own longest, as the encode pool's are; int8 one text a call)."""
    import numpy as np

    from ingest.workers.encode.onnx_model import OnnxModel, tokenize

    model = OnnxModel(str(model_file), threads=os.cpu_count() or 1, runtime=runtime, one_row=one_row)
    batches = [tokenize(ref.tokenizer_file, ref.max_seq_length, texts[i:i + 16]) for i in range(0, len(texts), 16)]
    rows = np.concatenate([model.embed(ids, lengths, normalize=True) for ids, lengths in batches])
    cos = (rows * reference).sum(axis=1)
    return {"mean": float(cos.mean()), "min": float(cos.min()), "precision": model.precision,
            "chunks_per_s": _rate(lambda: [model.embed(ids, lengths, False) for ids, lengths in batches], len(texts))}


def _rate(fn, n: int) -> float:
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return round(n / best, 1)


def _guard(entry: dict, file: str, min_cos: float, mean_cos: float = 0.0) -> dict:
    entry["ok"] = entry["min"] >= min_cos and entry["mean"] >= mean_cos
    if entry["ok"]:
        entry["file"] = file
    else:
        entry["reason"] = (f"vectors drift too far from torch (cosine mean {entry['mean']:.4f}, min {entry['min']:.4f}; "
                           f"the guard needs {f'mean >= {mean_cos}, ' if mean_cos else ''}min >= {min_cos})")
    return entry


def export(model_dir: str, out_dir: str) -> dict:
    """Write model.onnx (and model-int8.onnx when a recipe passes) and export.json into out_dir:
    per backend ok (guard passed), file, cosine mean and min against torch, chunks/s here."""
    import torch
    from sentence_transformers import SentenceTransformer

    from ingest.model_ref import resolve_model

    started = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ref = resolve_model(model_dir)
    torch.set_num_threads(os.cpu_count() or 1)
    model = SentenceTransformer(model_dir, device="cpu", model_kwargs={"attn_implementation": "eager"}).eval()
    texts = sorted(json.loads(PROBES.read_text()), key=len)
    reference = model.encode(texts, batch_size=16, normalize_embeddings=True, convert_to_numpy=True)
    result: dict = {"model": model_dir, "probes": len(texts), "torch_version": torch.__version__,
                    "torch": {"ok": True, "chunks_per_s": _rate(lambda: model.encode(texts, batch_size=16),
                                                                len(texts))}}
    fp32 = out / "model.onnx"
    tmp = out / f"model.onnx.{os.getpid()}.tmp"
    _export_fp32(model, tmp)
    result["onnx"] = _guard(_check(tmp, "onnxruntime", ref, texts, reference), fp32.name, FP32_MIN)
    if result["onnx"]["ok"]:
        os.replace(tmp, fp32)
        result["onnx-int8"] = _int8(fp32, out, ref, texts, reference)
        result["openvino"] = _openvino(fp32, ref, texts, reference)
    else:
        tmp.unlink()
        result["onnx-int8"] = result["openvino"] = {"ok": False, "reason": "the fp32 export failed its guard"}
    result["seconds"] = round(time.perf_counter() - started, 1)
    meta = out / f"export.json.{os.getpid()}.tmp"
    meta.write_text(json.dumps(result, indent=1))
    os.replace(meta, out / "export.json")
    return result


def _int8(fp32: Path, out: Path, ref, texts: list[str], reference) -> dict:
    from onnxruntime.quantization import quantize_dynamic

    tried = []
    for name, options in int8_recipes():
        q = out / f"model-int8.onnx.{os.getpid()}.tmp"
        quantize_dynamic(str(fp32), str(q), per_channel=True, **options)
        entry = _guard({"recipe": name, **_check(q, "onnxruntime", ref, texts, reference, one_row=True)},
                       "model-int8.onnx", INT8_MIN, INT8_MEAN)
        tried.append({k: entry[k] for k in ("recipe", "mean", "min")})
        if entry["ok"]:
            os.replace(q, out / "model-int8.onnx")
            return {**entry, "tried": tried}
        q.unlink()
    return {**entry, "reason": f"int8 {entry['reason']}", "tried": tried}


def _openvino(fp32: Path, ref, texts: list[str], reference) -> dict:
    """OpenVINO compiles model.onnx itself; its precision (bf16 or f32) must pass the fp32 guard."""
    try:
        import openvino  # noqa: F401
    except ImportError:
        return {"ok": False, "reason": "openvino is not installed (pip install openvino)"}
    return _guard(_check(fp32, "openvino", ref, texts, reference), fp32.name, FP32_MIN)


if __name__ == "__main__":
    from ingest.workers.spawn import watch_parent

    # A killed run must not leave its export running, holding the cache lock (the run's pid: ensure_export).
    watch_parent("export", parent_pid=int(os.environ.get("INGEST_PARENT_PID") or os.getppid()))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except ImportError:
        pass
    try:
        export(sys.argv[1], sys.argv[2])
    except Exception as exc:            # one line for the parent, which shows it to the user
        print(f"{type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr)
        sys.exit(3)
