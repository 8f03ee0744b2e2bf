"""Parent-side handle of one encode worker process (start it, send it batches, stop it), and
the plan of which workers to start.

Tasks go through a sender thread, so the coordinator never blocks on a full pipe while the
worker computes. The parent closes its copies of the child's pipe ends, so a dead worker
reads as EOF and a send to it fails with EPIPE instead of blocking; results are read without
blocking (_pipes.MessageReader). A batch's ids and vectors go through the worker's shared area when it
has one (_area NOTE). Workers start SHIELDED: a group-wide SIGINT or SIGTERM leaves
them to the parent (workers/spawn.py). Only the coordinator thread touches `in_flight`,
`running`, `ready` and `last_progress`.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Any, Iterable

import numpy as np

from ..limits import usable_cores
from ..spawn import SHIELDED
from . import _worker
from ._area import Area
from ._messages import EncodeTask, WorkerReady, WorkerSpec
from ._pipes import MessageReader


def plan_devices(devices: str | Iterable[str] | None, model_path: str, dtype: str | None,
                 normalize: bool, backend: str = "torch", model_file: str = "",
                 max_seq_length: int = 0, dim: int = 0, compile: bool = False, **batches: Any) -> list[WorkerSpec]:
    """One WorkerSpec per worker; CPU workers split the cores between them. The ONNX and null
    backends run on the CPU: "auto" means one CPU worker there. `batches`: WorkerSpec's batch_size,
    max_batch_tokens, batch_shapes and warm_up."""
    onnx = backend != "torch"
    auto = ["cpu"] if onnx else ["auto"]
    names = auto if devices in (None, "auto") else [devices] if isinstance(devices, str) else list(devices)
    names = ["cuda:0" if n == "cuda" else n for n in names]
    for name in names:
        if not (name in ("auto", "cpu") or (name.startswith("cuda:") and name[5:].isdigit())):
            raise ValueError(f"device {name!r}: use \"auto\", \"cpu\", \"cuda\" or \"cuda:N\"")
    if not names or ("auto" in names and len(names) > 1):
        raise ValueError("devices: \"auto\" or a non-empty list of devices such as [\"cuda:0\"]")
    if onnx and any(n != "cpu" for n in names):
        raise ValueError(f"backend {backend!r} runs on the CPU; use backend \"torch\" for CUDA devices")
    threads = max(1, usable_cores() // max(1, sum(n in ("auto", "cpu") for n in names)))
    return [WorkerSpec(model_path, name, dtype, threads, normalize, backend, model_file, max_seq_length, dim, compile,
                       **batches) for name in names]


class EncodeProcess:
    def __init__(self, slot: int, spec: WorkerSpec):
        self.slot = slot
        self.spec = spec
        task_reader, self._task_writer = SHIELDED.Pipe(duplex=False)
        results, result_writer = SHIELDED.Pipe(duplex=False)
        self.area = Area.create(f"ingest-encode-{slot}")       # mapped at WorkerReady (_area NOTE)
        self.process = SHIELDED.Process(target=_worker.main, args=(spec, task_reader, result_writer, self.area),
                                        name=f"ingest-encode-{slot}", daemon=True)
        self.process.start()
        task_reader.close()
        result_writer.close()
        self._free: list[int] = []              # the area's slots no batch holds
        self._slot_of: dict[int, int] = {}      # batch id -> its slot
        self.results = MessageReader(results)
        self.launched = time.monotonic()
        self.ready: WorkerReady | None = None
        self.startup_seconds: float | None = None
        self.in_flight: dict[int, Any] = {}     # batch id -> batch, in the order sent
        self.running: set[int] = set()          # ids the worker started and has not answered
        self.last_progress = self.launched
        self._outgoing: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._send_loop, name=f"ingest-encode-sender-{slot}", daemon=True).start()

    @property
    def where(self) -> str:
        return f"encode worker {self.ready.device if self.ready else self.spec.device}"

    def on_ready(self, msg: WorkerReady) -> None:
        """The worker is up: map the shared area it sized (none: every batch through the pipes)."""
        self.ready = msg
        if self.area is not None:
            self.area.map(msg.slots, msg.ids_cap, msg.rows_cap, msg.dim)
            self._free = list(range(self.area.slots))[::-1]

    def submit(self, batch: Any, texts: tuple[str, ...] | None) -> None:
        """Send a batch: its ids through a free slot of the shared area if it fits one, else the pipe."""
        if not self.in_flight:
            self.last_progress = time.monotonic()
        self.in_flight[batch.id] = batch
        ids = batch.ids
        if self._free and self.area.fits(ids):
            slot = self._slot_of[batch.id] = self._free.pop()
            self.area.put_ids(slot, ids)
            self._outgoing.put(EncodeTask(batch.id, None, batch.lengths, texts, slot, ids.shape[1]))
        else:
            self._outgoing.put(EncodeTask(batch.id, ids, batch.lengths, texts))

    def answered(self, batch_id: int, embeddings: np.ndarray | None, rows: int) -> np.ndarray | None:
        """A batch's TaskDone or TaskFailed is here: its slot is free again. Its vectors (`rows` of them) are
        `embeddings`, or, when None, in its slot: read them before the next submit."""
        slot = self._slot_of.pop(batch_id, -1)
        if slot < 0:
            return embeddings
        self._free.append(slot)
        return self.area.vectors(slot, rows) if embeddings is None else embeddings

    def _send_loop(self) -> None:
        try:
            while True:
                task = self._outgoing.get()
                self._task_writer.send(task)
                if task is None:
                    return
        except OSError:                         # the worker is gone (EPIPE)
            return
        finally:
            self._task_writer.close()

    def kill(self) -> None:
        """SIGKILL and reap (a hung or dying worker)."""
        self.process.kill()
        self.process.join(5)
        self._close_pipes()

    def stop(self) -> None:
        """Ask the worker to finish its queued batches and exit."""
        self._outgoing.put(None)

    def finish(self, grace_s: float) -> None:
        """Wait up to grace_s for a stopped worker to exit, then terminate, then kill."""
        self.process.join(max(grace_s, 0.0))
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(1)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(1)
        self._close_pipes()

    def _close_pipes(self) -> None:
        self._outgoing.put(None)                # the sender thread exits (EPIPE) and closes its end
        self.results.close()
        if self.area is not None:
            self.area.close()
