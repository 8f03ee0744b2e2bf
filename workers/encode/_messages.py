"""The messages between the encode pool's processes, and the one error its callers catch."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..failure import Failure


class EncodeError(RuntimeError):
    """Encoding failed. The message is one line: the chunk (index and a prefix of its text)
    and what happened; `failure` holds the details, `traceback` the worker's traceback."""

    def __init__(self, message: str, failure: Failure | None = None, chunk_index: int | None = None):
        super().__init__(message)
        self.failure = failure
        self.chunk_index = chunk_index
        if failure is not None and failure.traceback:
            self.add_note("worker traceback:\n" + failure.traceback.rstrip())

    @property
    def traceback(self) -> str | None:
        return self.failure.traceback if self.failure else None


@dataclass(frozen=True)
class WorkerSpec:
    """How to start one encode worker."""
    model_path: str
    device: str                 # "auto" (first worker only), "cpu", "cuda:N"
    dtype: str | None           # None: float16 on CUDA, float32 on CPU
    threads: int                # torch (or ONNX Runtime) threads on CPU
    normalize: bool
    backend: str = "torch"      # "torch"; "onnx", "onnx-int8", "openvino": model_file on the CPU, no torch; "null"
    model_file: str = ""        # the exported .onnx file (ONNX backends)
    max_seq_length: int = 0     # the model's (ONNX and null backends; torch reads it from the model)
    dim: int = 0                # the model's embedding dimension (null backend: no model is loaded)
    compile: bool = False       # torch.compile the transformer (torch backend)
    batch_size: int | None = None           # the caller's batch settings (None: the device's), so that a
    max_batch_tokens: int | None = None     # worker knows the plan's shapes to warm up
    batch_shapes: str = "auto"  # "auto", "bounded", "exact" (_shapes NOTE)
    warm_up: str = "auto"       # run each shape of a bounded plan once at start: "auto" (on CUDA), "always", "never"


@dataclass(frozen=True, eq=False)
class Pretokenized:
    """Texts with their token ids already made (by the chunker): the pool skips its tokenizer
    processes. ids: int32, every text's ids ([CLS] ... [SEP]) concatenated; lengths: int32 per text."""
    texts: Sequence[str]
    ids: np.ndarray
    lengths: np.ndarray

    def __len__(self) -> int:
        return len(self.texts)


@dataclass(frozen=True)
class BatchPlan:
    """How windows are cut into batches: rows and padded tokens per batch at most, the model's
    max length (padding never goes beyond it), the multiple lengths are padded to (32 in a bounded
    plan; else 8 on CUDA or when compiled; 1 on the CPU, where padding is only cost), and whether the
    shapes are bounded (_shapes NOTE)."""
    batch_size: int
    max_tokens: int
    max_length: int
    multiple: int = 1
    bounded: bool = False


@dataclass(frozen=True, eq=False)
class TokenBatch:
    """Rows of one window, sorted by length and padded to the longest of them."""
    positions: np.ndarray       # int32 row positions inside the window
    ids: np.ndarray             # int32 (rows, longest)
    lengths: np.ndarray         # int32 (rows,)


@dataclass(frozen=True, eq=False)
class TokenizedWindow:
    batches: tuple[TokenBatch, ...]     # every text of the window but the rejected ones
    seconds: float
    rejected: tuple[tuple[int, str], ...] = ()      # (position, the tokenizer's error): texts it refused


@dataclass(frozen=True, eq=False)
class EncodeTask:
    batch_id: int
    ids: np.ndarray | None          # None: in the worker's shared area, slot `slot`, `width` ids a row (_area NOTE)
    lengths: np.ndarray
    texts: tuple[str, ...] | None   # only while the INGEST_FAULT test hook is set
    slot: int = -1                  # the batch's slot of the shared area (its vectors come back there too)
    width: int = 0


@dataclass(frozen=True)
class DevicesFound:
    """Sent by a worker started with device "auto", before it loads the model."""
    cuda_devices: int


@dataclass(frozen=True)
class WorkerReady:
    pid: int
    device: str
    dim: int
    max_seq_length: int
    slots: int = 0              # the shared area's size (_area NOTE); 0: it has none
    ids_cap: int = 0
    rows_cap: int = 0


@dataclass(frozen=True)
class TaskStarted:
    batch_id: int


@dataclass(frozen=True, eq=False)
class TaskDone:
    batch_id: int
    embeddings: np.ndarray | None   # float32 (rows, dim), rows in the task's order; None: in the task's slot
    seconds: float              # busy time: from the later of its launch and the previous batch's end


@dataclass(frozen=True)
class TaskFailed:
    batch_id: int
    failure: Failure
