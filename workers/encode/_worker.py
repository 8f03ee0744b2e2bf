"""Encode worker process: loads the model itself and embeds pre-tokenized batches.

The model is loaded from the resolved local directory in this process (never pickled
through a pipe), by torch_model: a BERT encoder in torch alone (no sentence-transformers import),
any other model through SentenceTransformer's modules; either way under torch.inference_mode, like
SentenceTransformer.encode minus its tokenization. On CUDA, the next batch is pinned, copied and
launched while the current one computes (_Runner). At start, a worker runs one small batch, or with a
bounded plan on CUDA (warm_up) each of the plan's shapes once, with and without a mask (_shapes NOTE).
torch is imported inside functions only: the parent imports this module for `main`. With an
ONNX backend the worker runs OnnxRunner, with the null backend NullRunner (constant rows, no
model), and neither imports torch or sentence-transformers.
Protocol and fault handling: NOTE in workers/encode/__init__.py.
"""
from __future__ import annotations

import ctypes
import json
import multiprocessing as mp
import os
import random
import struct
import sys
import time
import traceback
from collections import deque
from dataclasses import replace
from multiprocessing.connection import Connection

import numpy as np

from ..failure import Failure
from ..spawn import watch_parent
from ._area import IN_FLIGHT, Area
from ._messages import (DevicesFound, EncodeTask, TaskDone, TaskFailed, TaskStarted, WorkerReady,
                        WorkerSpec)
from ._shapes import make_plan, plan_shapes

FAULT_ENV = "INGEST_FAULT"
CUDA_HOST_THREADS = 2
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3          # glibc mallopt parameters


def fault_hook_active() -> bool:
    """Whether tasks must carry their texts (only the test hook below reads them)."""
    return bool(os.environ.get(FAULT_ENV))


class FaultHook:
    """Test hook, off unless INGEST_FAULT is set when the worker starts. Its value is a JSON rule
    or list of rules: {"match": "POISON", "action": "hang|stall|exit|raise|delay|modules", "seconds": 0.3,
    "once_file": "/tmp/x", "file": "/tmp/m.json"}. Before each batch, the first rule whose `match`
    occurs in one of the batch's texts fires: hang sleeps for ever, stall writes the first bytes of
    a message to the parent and then sleeps for ever, exit calls os._exit(3), raise raises
    RuntimeError, delay sleeps uniform(0, seconds), modules writes the names in this process's
    sys.modules to `file` (JSON). With once_file, a rule fires only in the
    process that creates that file first, so a replacement worker does not hit it again."""

    def __init__(self, value: str | None):
        rules = json.loads(value) if value else []
        self.rules = [rules] if isinstance(rules, dict) else rules

    def fire(self, texts: tuple[str, ...] | None, outbox: Connection) -> None:
        for rule in self.rules:
            if texts is None or not any(rule.get("match", "") in t for t in texts):
                continue
            if rule.get("once_file"):
                try:
                    os.close(os.open(rule["once_file"], os.O_CREAT | os.O_EXCL))
                except FileExistsError:
                    continue
            action = rule["action"]
            if action == "stall":
                os.write(outbox.fileno(), struct.pack("!i", 4096) + b"\x80")     # a length, then 1 byte of 4,096
            if action in ("hang", "stall"):
                while True:
                    time.sleep(3600)
            if action == "exit":
                os._exit(3)
            if action == "raise":
                raise RuntimeError(f"injected fault for {rule.get('match')!r}")
            if action == "delay":
                time.sleep(random.uniform(0, float(rule.get("seconds", 0.1))))
            if action == "modules":
                with open(rule["file"], "w") as f:
                    json.dump(sorted(sys.modules), f)
            return


class _Runner:
    """The model on one device. launch() starts a batch and returns a handle, collect() waits
    for its embeddings. On CUDA both are asynchronous: the ids go host -> device from pinned
    memory on a side stream, the embeddings come back into pinned memory, and `depth` = 2
    batches are in flight, so the GPU computes one while this process launches the next and
    copies its input. On the CPU, launch() computes and depth is 1."""

    def __init__(self, spec: WorkerSpec, device: str):
        import torch

        from .torch_model import load

        self.torch = torch
        self.cuda = device.startswith("cuda")
        self.device = torch.device(device)
        self.depth = 2 if self.cuda else 1
        if self.cuda:
            torch.cuda.set_device(self.device)
            self.copy_stream = torch.cuda.Stream(self.device)
        # On CUDA the host side only launches kernels: CUDA_HOST_THREADS keeps torch off the cores
        # that loaders and tokenizers need.
        torch.set_num_threads(CUDA_HOST_THREADS if self.cuda else spec.threads)
        self.model = load(spec.model_path, device, getattr(torch, spec.dtype or ("float16" if self.cuda else "float32")))
        if spec.compile:
            self.model.compile()        # bounded shapes (_shapes NOTE): compiled graphs are reused
        self.normalize = spec.normalize
        self.dim, self.max_seq_length = self.model.dim, self.model.max_seq_length

    def launch(self, task: EncodeTask):
        torch = self.torch
        full = bool((task.lengths == task.ids.shape[1]).all())     # known on the host: no sync
        ids, lengths = torch.from_numpy(task.ids), torch.from_numpy(task.lengths)
        with torch.inference_mode():
            if not self.cuda:
                return self._forward(ids, lengths, full), None
            with torch.cuda.stream(self.copy_stream):
                ids = ids.pin_memory().to(self.device, non_blocking=True)
                lengths = lengths.pin_memory().to(self.device, non_blocking=True)
            compute = torch.cuda.current_stream(self.device)
            compute.wait_stream(self.copy_stream)
            ids.record_stream(compute)          # allocated on the copy stream, used on this one
            lengths.record_stream(compute)
            out = self._forward(ids, lengths, full)
            host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
            host.copy_(out, non_blocking=True)
            done = torch.cuda.Event()
            done.record(compute)
            return host, done

    def _forward(self, ids, lengths, full: bool):
        out = self.model.embed(ids.long(), lengths, full).float()
        return self.torch.nn.functional.normalize(out, p=2, dim=1) if self.normalize else out

    def collect(self, handle) -> np.ndarray:
        out, done = handle
        if done is not None:
            done.synchronize()                  # this batch only; the next one keeps computing
        return out.numpy()

    def recover(self, exc: Exception) -> None:
        """After a failed batch: free cached memory after an out-of-memory error; exit after any
        other CUDA error, which leaves the context unusable (the parent starts a new worker)."""
        if not self.cuda:
            return
        if isinstance(exc, self.torch.cuda.OutOfMemoryError):
            self.torch.cuda.empty_cache()
        elif "CUDA" in str(exc):
            os._exit(1)


class _Synchronous:
    """A runner whose launch() computes the rows (the interface of _Runner with depth 1)."""

    depth = 1

    def collect(self, handle) -> np.ndarray:
        return handle

    def recover(self, exc: Exception) -> None:
        pass


class NullRunner(_Synchronous):
    """No model: constant unit rows of the model's dimension, to measure everything but the model."""

    def __init__(self, spec: WorkerSpec):
        if spec.dim < 1:
            raise ValueError(f"the null backend needs the model's dimension; none found in {spec.model_path}")
        self.dim, self.max_seq_length = spec.dim, spec.max_seq_length
        self.row = np.full((1, spec.dim), spec.dim ** -0.5, dtype=np.float32)

    def launch(self, task: EncodeTask):
        return np.repeat(self.row, len(task.lengths), axis=0)


class OnnxRunner(_Synchronous):
    """An exported model on the CPU (ONNX Runtime; OpenVINO for backend "openvino"). Threads: the
    worker's share of the cores."""

    def __init__(self, spec: WorkerSpec):
        from .onnx_model import OnnxModel, one_row_for, runtime_for

        self.model = OnnxModel(spec.model_file, spec.threads, runtime_for(spec.backend), one_row_for(spec.backend))
        self.normalize = spec.normalize
        self.dim = self.model.dim
        self.max_seq_length = spec.max_seq_length

    def launch(self, task: EncodeTask):
        return self.model.embed(task.ids, task.lengths, self.normalize)


def _keep_freed_memory() -> None:
    """glibc serves each allocation over its mmap threshold (128 KiB at first) with fresh pages: a CPU
    batch's activations (up to ~25 MB at 3,072 tokens) then cost a page fault per 4 KiB at every op,
    about 10% of the forward here (1.9 M faults and 3-4 s of system time per 450 chunks; with the
    threshold at 32 MiB, 0.17 M and 0.6 s). glibc raises the threshold itself only after freeing a
    chunk that big, which our small warm-up batch never does. Keep freed memory for reuse instead
    (bounded: up to 128 MiB of free heap before it is given back). No-op off glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)
        libc.mallopt(M_TRIM_THRESHOLD, 128 << 20)
    except (OSError, AttributeError):
        pass


def main(spec: WorkerSpec, inbox: Connection, outbox: Connection, area: Area | None = None) -> None:
    """Process target: start up, report WorkerReady (or a Failure), then serve batches (their ids and
    vectors through `area` when the parent gave one: _area NOTE)."""
    watch_parent("encode")
    _keep_freed_memory()            # stop signals: the parent decides (started SHIELDED, workers/spawn.py)
    where = f"encode worker {spec.device}"
    try:
        device = _resolve_device(spec, outbox)
        where = f"encode worker {device}"
        runner = (_Runner(spec, device) if spec.backend == "torch"
                  else NullRunner(spec) if spec.backend in ("null", "stub") else OnnxRunner(spec))
        for task in warm_up_tasks(spec, device, runner.max_seq_length):
            runner.collect(runner.launch(task))  # first-call costs count as start-up
        sizes = _size_area(area, spec, device, runner)
    except BaseException as exc:
        outbox.send(Failure(where, f"failed to start: {type(exc).__name__}: {exc}", pid=os.getpid(),
                            traceback=traceback.format_exc()))
        return
    outbox.send(WorkerReady(os.getpid(), device, runner.dim, runner.max_seq_length, *sizes))
    try:
        _serve(runner, inbox, outbox, FaultHook(os.environ.get(FAULT_ENV)), where, area)
    except BrokenPipeError:                              # the parent is gone
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)            # skip the interpreter's teardown of torch (~1 s): nothing is left to save


def warm_up_tasks(spec: WorkerSpec, device: str, max_seq_length: int) -> list[EncodeTask]:
    """What a worker runs before it reports ready: each shape of its bounded plan with a mask and
    without one (spec.warm_up "always", or "auto" on CUDA), else one small batch."""
    plan = make_plan(device, max_seq_length, spec.batch_size, spec.max_batch_tokens, spec.compile, spec.batch_shapes)
    warm = spec.warm_up == "always" or (spec.warm_up == "auto" and device.startswith("cuda"))
    tasks = []
    for rows, width in plan_shapes(plan) if warm else ():
        for last in (1, width):                          # a masked batch, then one that needs no mask
            lengths = np.full(rows, width, np.int32)
            lengths[-1] = last
            tasks.append(EncodeTask(-1, np.zeros((rows, width), np.int32), lengths, None))
    return tasks or [EncodeTask(-1, ids=np.zeros((1, 2), np.int32), lengths=np.array([2], np.int32), texts=None)]


def _size_area(area: Area | None, spec: WorkerSpec, device: str, runner) -> tuple[int, int, int]:
    """The shared area sized for this worker's batch plan: (slots, ids a slot, rows a slot); zeros without one."""
    if area is None:
        return 0, 0, 0
    plan = make_plan(device, runner.max_seq_length, spec.batch_size, spec.max_batch_tokens, spec.compile,
                     spec.batch_shapes)
    sizes = (IN_FLIGHT["cuda" if device.startswith("cuda") else "cpu"], max(plan.max_tokens, plan.max_length),
             plan.batch_size)
    area.size(*sizes, runner.dim)
    return sizes


def _resolve_device(spec: WorkerSpec, outbox: Connection) -> str:
    if spec.device != "auto":
        return spec.device
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    outbox.send(DevicesFound(count))
    return "cuda:0" if count else "cpu"


def _receive(inbox: Connection, block: bool) -> EncodeTask | None | bool:
    """The next task; None means stop (asked to, or the parent is gone); False means none
    waiting (block=False only)."""
    parent = mp.parent_process()
    try:
        while not inbox.poll(1.0 if block else 0):
            if not block:
                return False
            if parent is not None and not parent.is_alive():
                return None
        return inbox.recv()
    except (EOFError, OSError):
        return None


def _serve(runner: _Runner | OnnxRunner | NullRunner, inbox: Connection, outbox: Connection, faults: FaultHook,
           where: str, area: Area | None = None) -> None:
    """Launch up to runner.depth batches, then report the oldest when its embeddings are back.
    A batch's seconds are busy time: from the later of its launch and the previous batch's end
    (on CUDA the next batch is launched while the current one computes)."""
    launched: deque = deque()       # (task, handle, start time), oldest first
    stopping = False
    last_done = 0.0

    def fail(task: EncodeTask, exc: Exception) -> None:
        outbox.send(TaskFailed(task.batch_id, Failure(where, f"raised {type(exc).__name__}: {exc}",
                                                      pid=os.getpid(), traceback=traceback.format_exc())))
        runner.recover(exc)

    while True:
        while not stopping and len(launched) < runner.depth:
            task = _receive(inbox, block=not launched)
            if task is False:
                break
            if task is None:
                stopping = True
                break
            outbox.send(TaskStarted(task.batch_id))   # before anything that could fail or hang
            started = time.perf_counter()
            if task.ids is None:                       # in the shared area (_area NOTE)
                task = replace(task, ids=area.ids(task.slot, len(task.lengths), task.width))
            try:
                faults.fire(task.texts, outbox)
                launched.append((task, runner.launch(task), started))
            except Exception as exc:
                fail(task, exc)
        if not launched:
            if stopping:
                return
            continue
        task, handle, started = launched.popleft()
        try:
            embeddings = runner.collect(handle)
        except Exception as exc:
            fail(task, exc)
            continue
        if task.slot >= 0:
            area.vectors(task.slot, len(embeddings))[...] = embeddings
            embeddings = None
        now = time.perf_counter()
        outbox.send(TaskDone(task.batch_id, embeddings, now - max(started, last_done)))
        last_done = now
