"""The ONNX backends with the real packaged model: export and guard, rows against torch, workers
without torch, search per backend, a backend change refused, the sentence-transformers drop-in.

The session shares one export cache (conftest.onnx_cache), so the model is exported once.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import cli_env, run, search
from ingest.api import EncodePool, encode_multi_process
from ingest.backends import BackendError, ensure_export, export_dir
from ingest.model_ref import resolve_model

TEXTS = ["The lighthouse keeper logs every passing ship.", "Invoices are due within thirty days.",
         "Cranes return to the marsh in early March, and the reeds turn green again along the river.",
         "short", "A " * 300 + "very long text that the tokenizer truncates at the model's limit."]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def torch_rows() -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(resolve_model().path, device="cpu").encode(TEXTS, convert_to_numpy=True)


def guarded(backend: str) -> None:
    """Skip unless this CPU's export passed `backend`'s guard. The guard decides per machine (int8's
    recipe and OpenVINO's precision depend on the CPU); onnx fp32 must always pass."""
    entry = ensure_export(resolve_model())[backend]
    if not entry["ok"]:
        pytest.skip(f"{backend} refused by its guard on this CPU: {entry['reason']}")


@pytest.mark.slow
def test_onnx_fp32_export_rows_equal_torch(torch_rows: np.ndarray) -> None:
    record = ensure_export(resolve_model())
    assert record["onnx"]["ok"] and record["onnx"]["min"] >= 0.9999
    with EncodePool(backend="onnx") as pool:
        assert pool.backend == "onnx"
        assert cosines(pool.encode(TEXTS), torch_rows).min() >= 0.9999


def test_openvino_rows_equal_torch(torch_rows: np.ndarray) -> None:
    guarded("openvino")
    with EncodePool(backend="openvino") as pool:
        assert cosines(pool.encode(TEXTS), torch_rows).min() >= 0.9999


def test_int8_rows_within_the_guard() -> None:
    """The pool's int8 rows stay within the guard's bounds on the guard's own probe texts. The guard
    judges int8 there, per CPU; on other texts int8 may drift further (0.989 mean on TEXTS on an AMD
    EPYC), which is why `auto` never picks it."""
    from sentence_transformers import SentenceTransformer

    from ingest.onnx_export import INT8_MEAN, INT8_MIN, PROBES

    guarded("onnx-int8")
    entry = ensure_export(resolve_model())["onnx-int8"]
    assert entry["mean"] >= INT8_MEAN and entry["min"] >= INT8_MIN
    assert entry["recipe"] in [r["recipe"] for r in entry["tried"]]
    probes = sorted(json.loads(PROBES.read_text()), key=len)
    reference = SentenceTransformer(resolve_model().path, device="cpu").encode(probes, convert_to_numpy=True)
    with EncodePool(backend="onnx-int8", normalize_embeddings=True) as pool:
        rows = pool.encode(probes)
    assert np.allclose(np.linalg.norm(rows, axis=1), 1, atol=1e-5)
    cos = cosines(rows, reference)
    assert cos.mean() >= INT8_MEAN and cos.min() >= INT8_MIN, (cos.mean(), cos.min())


def test_int8_vectors_depend_on_the_text_alone(torch_rows: np.ndarray) -> None:
    """Issue 40, item 4: int8's activation scales are a text's own (one text a call), so a text alone and in two
    different batches (other neighbours, other padding) gives the same vector; and it stays near torch."""
    from ingest.onnx_export import PROBES

    guarded("onnx-int8")
    probes = json.loads(PROBES.read_text())
    with EncodePool(backend="onnx-int8", normalize_embeddings=True) as pool:
        alone = np.concatenate([pool.encode([t]) for t in TEXTS])
        first = pool.encode(TEXTS + probes[:20])[:len(TEXTS)]
        second = pool.encode(probes[-12:] + TEXTS[::-1])[-len(TEXTS):][::-1]
    for a, b in ((alone, first), (alone, second), (first, second)):
        assert cosines(a, b).min() >= 0.9999, cosines(a, b)
    assert cosines(alone, torch_rows).mean() >= 0.99, cosines(alone, torch_rows)


def _hostile_copy(dst: Path) -> Path:
    """The packaged model with, in every layer, one FFN unit given a bias of 1,000 and its output
    weights zeroed: the same function in fp32 (the unit adds nothing), but the per-tensor int8
    activation scale is blown up by that unit, so int8 vectors lose everything else."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(resolve_model().path, dst)
    weights = load_file(str(dst / "model.safetensors"))
    for name in [k for k in weights if k.endswith("intermediate.dense.bias")]:
        layer = name.rsplit(".intermediate", 1)[0]
        weights[name][7] = 1000.0
        weights[f"{layer}.output.dense.weight"][:, 7] = 0.0
    save_file(weights, str(dst / "model.safetensors"))
    return dst


@pytest.mark.slow
def test_a_model_that_fails_the_int8_guard_is_refused(tmp_path: Path) -> None:
    ref = resolve_model(str(_hostile_copy(tmp_path / "hostile")))
    record = ensure_export(ref)
    assert record["onnx"]["ok"], record                  # fp32 still equals torch
    assert not record["onnx-int8"]["ok"] and not (export_dir(ref) / "model-int8.onnx").exists()
    with pytest.raises(BackendError) as info:
        EncodePool(ref, backend="onnx-int8")
    message = str(info.value)
    assert "refused" in message and "cosine" in message and "\n" not in message
    work = tmp_path / "work"
    (work / "docs").mkdir(parents=True)
    (work / "docs" / "a.txt").write_text("Some text to embed.")
    res = run(work / "docs", work, "--model", ref.path, "--backend", "onnx-int8")
    assert res.rc == 2 and "refused" in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    res = run(work / "docs", work, "--model", ref.path)          # auto: an exact backend instead
    assert res.rc == 0, res.stderr
    assert res.report["totals"]["backend"] in ("onnx", "openvino", "torch")


@pytest.mark.parametrize("backend,runtime", [("onnx", "onnxruntime"), ("openvino", "openvino")])
def test_onnx_workers_never_import_torch(tmp_path: Path, backend: str, runtime: str) -> None:
    if backend != "onnx":
        guarded(backend)
    dump = tmp_path / "modules.json"
    os.environ["INGEST_FAULT"] = json.dumps({"match": "SHOW-MODULES", "action": "modules", "file": str(dump)})
    try:
        with EncodePool(backend=backend) as pool:
            pool.encode(["SHOW-MODULES please"])
    finally:
        del os.environ["INGEST_FAULT"]
    modules = set(json.loads(dump.read_text()))
    assert runtime in modules
    assert not {"torch", "sentence_transformers", "transformers"} & modules


def test_drop_in_for_the_sentence_transformers_pool() -> None:
    with EncodePool(backend="onnx") as pool:
        pids = pool.worker_pids
        ours = encode_multi_process(TEXTS, pool, batch_size=32, chunk_size=None)
        again = encode_multi_process(TEXTS, pool=pool, normalize_embeddings=True)
        assert pool.worker_pids == pids                      # the running pool did the work
        assert np.allclose(ours, pool.encode(TEXTS), atol=1e-6)
        assert np.allclose(again, ours / np.linalg.norm(ours, axis=1, keepdims=True), atol=1e-6)


_NO_TORCH_SEARCH = """
import json, sys
from ingest.search import search
hits = search(sys.argv[1], "documents", "who logs the ships", 2)
print(json.dumps({"top": hits[0]["source"], "torch": "torch" in sys.modules,
                  "st": "sentence_transformers" in sys.modules}))
"""


@pytest.mark.slow
def test_search_per_backend_and_backend_changes(work: Path) -> None:
    docs = work / "docs"
    (docs / "lighthouse.txt").write_text("Coastal log. The lighthouse keeper logs every passing ship, day and night.")
    (docs / "invoice.txt").write_text("Invoice 42: payment is due within thirty days of delivery.")
    (docs / "cranes.txt").write_text("Migratory cranes return to the marsh in early March.")
    record = ensure_export(resolve_model())
    for backend in [b for b in ("onnx-int8", "openvino", "onnx", "torch") if record.get(b, {"ok": True})["ok"]]:
        res = run(docs, work, "--backend", backend, "--reembed")
        assert res.rc == 0, res.stderr
        assert res.report["totals"]["backend"] == backend
        assert search(work, "who logs the ships")[0]["source"] == "lighthouse.txt"
        assert search(work, "when is the payment due")[0]["source"] == "invoice.txt"
        probe = subprocess.run([sys.executable, "-c", _NO_TORCH_SEARCH, str(work / "store.db")], capture_output=True,
                               text=True, env=cli_env(), timeout=300)
        assert probe.returncode == 0, probe.stderr
        seen = json.loads(probe.stdout.strip().splitlines()[-1])
        # torch collections too: the guarded ONNX fp32 export stands in for torch at query time
        assert seen == {"top": "lighthouse.txt", "torch": False, "st": False}, (backend, seen)
    res = run(docs, work, "--backend", "onnx")                        # a torch collection now
    assert res.rc == 2 and "holds torch vectors" in res.stderr and "--reembed" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    res = run(docs, work)                                              # auto keeps the collection's backend
    assert res.rc == 0 and res.report["totals"]["backend"] == "torch", res.stderr
    assert {f["status"] for f in res.report["files"]} == {"unchanged"}
