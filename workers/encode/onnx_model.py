"""An exported sentence-transformers model (ONNX) run on the CPU: token ids in, sentence
embeddings out, by ONNX Runtime or by OpenVINO. Imports one of those runtimes, tokenizers and
numpy, never torch, so such an encode worker is ready in well under a second, and `ingest
search` embeds a query without torch. The graph (ingest/onnx_export.py) takes input_ids and
attention_mask and returns the pooled embedding; normalizing is done here.

NOTE (int8, one text a call): the int8 export (onnx-int8) is dynamically quantized: each call
scales its activations by the range of the whole input tensor, so in a batch one text's vector
would depend on its neighbours and on the padding (cosine down to 0.978 alone against in a batch).
`one_row` runs each text alone, at its own length: its scales are its own, and equal texts give
equal vectors whatever the batch (reuse and exact resume rest on that). Static quantization
(scales calibrated once) was measured too and lost either accuracy or speed (docs/encoding.md);
one text a call costs nothing on the CPU, as no padding is computed.

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


def one_row_for(backend: str) -> bool:
    """Whether a backend's export runs one text a call (NOTE: int8)."""
    return backend == "onnx-int8"


class OnnxModel:
    def __init__(self, model_file: str, threads: int, runtime: str = "onnxruntime", one_row: bool = False):
        threads = max(1, threads)
        self.runtime, self.one_row = runtime, one_row
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
        if self.one_row and len(lengths) > 1:
            return np.concatenate([self.embed(ids[i:i + 1, :max(1, int(n))], lengths[i:i + 1], normalize)
                                   for i, n in enumerate(lengths)])
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
