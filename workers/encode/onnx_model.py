"""An exported sentence-transformers model (ONNX) run on the CPU: token ids in, sentence
embeddings out, by ONNX Runtime or by OpenVINO. Imports one of those runtimes, tokenizers and
numpy, never torch, so such an encode worker is ready in well under a second, and `ingest
search` embeds a query without torch. The graph (ingest/onnx_export.py) takes input_ids and
attention_mask and returns the pooled embedding; normalizing is done here.

OpenVINO compiles the same ONNX file. It picks its own inference precision for the CPU it
finds: bfloat16 where the CPU has it (AMX, AVX512_BF16), else float32. The export's guard
measures the result against torch on that machine.
"""
from __future__ import annotations

import os

import numpy as np



def runtime_for(backend: str) -> str:
    """The runtime that runs a backend's export: OpenVINO for "openvino", else ONNX Runtime."""
    return "openvino" if backend == "openvino" else "onnxruntime"


class OnnxModel:
    def __init__(self, model_file: str, threads: int, runtime: str = "onnxruntime"):
        threads = max(1, threads)
        self.runtime = runtime
        if runtime == "openvino":
            import openvino as ov

            core = ov.Core()
            if os.access(os.path.dirname(model_file), os.W_OK):     # compiled blobs: 0.3 s -> 0.06 s to load
                core.set_property({"CACHE_DIR": os.path.join(os.path.dirname(model_file), "openvino-cache")})
            compiled = core.compile_model(model_file, "CPU", {"INFERENCE_NUM_THREADS": threads,
                                                              "ENABLE_CPU_PINNING": False})
            self._request = compiled.create_infer_request()
            self.dim = int(compiled.outputs[0].get_partial_shape()[-1].get_length())
            hint = compiled.get_property("INFERENCE_PRECISION_HINT")
            self.precision = hint.get_type_name() if hasattr(hint, "get_type_name") else str(hint)
            return
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self._session = ort.InferenceSession(model_file, options, providers=["CPUExecutionProvider"])
        self.dim = int(self._session.get_outputs()[0].shape[-1])
        self.precision = "f32"

    def embed(self, ids: np.ndarray, lengths: np.ndarray, normalize: bool) -> np.ndarray:
        """float32 (rows, dim) for padded ids (rows, longest) whose row i has lengths[i] real tokens."""
        mask = (np.arange(ids.shape[1])[None, :] < lengths[:, None]).astype(np.int64)
        inputs = {"input_ids": ids.astype(np.int64), "attention_mask": mask}
        if self.runtime == "openvino":
            out = np.array(self._request.infer(inputs)[0], dtype=np.float32)     # a copy: OpenVINO reuses its buffer
        else:
            out = np.ascontiguousarray(self._session.run(None, inputs)[0], dtype=np.float32)
        if normalize:
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out


def tokenize(tokenizer_file: str, max_length: int, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(ids int32 (rows, longest) padded, lengths int32): the ids the encode pool's tokenizers make."""
    from ._tokenize import load_tokenizer

    tok, pad_id = load_tokenizer(tokenizer_file, max_length)
    rows = [enc.ids for enc in tok.encode_batch(texts)]
    lengths = np.fromiter(map(len, rows), dtype=np.int32, count=len(rows))
    ids = np.full((len(rows), int(lengths.max(initial=1))), pad_id, dtype=np.int32)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = row
    return ids, lengths
