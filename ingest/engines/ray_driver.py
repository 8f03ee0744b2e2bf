"""`ingest run --engine ray`: the same run on Ray Data, on one machine or a cluster.

The driver (this process) scans, plans each file against the manifest and records results as
the local engine does (`ingest.engines.run.Run`: same report, exit codes, incremental semantics); only
`ingest` differs. Files for the loaders become one Ray dataset per loader pool (its load tasks
reserve that pool's [ray.loader_cpus]), unioned into the encode actors ([ray] encode_actors,
each with encode_gpus GPUs) and the writer actors ([ray] writers), as in Ray's own document
embedding benchmark. The stages are `ingest.engines.ray_stages`.

NOTE (driver protocol): a consumer thread iterates the dataset's acknowledgements (one per
part of a file, in no particular order across files) onto a queue; the main thread takes them
with a timeout, checks Ctrl-C, the lease and the flush timer in between, and counts each
file's parts. A file whose parts are all acknowledged joins the Ledger, which records it at
the next flush (every FLUSH_EVERY_S, FLUSH_ROWS rows or FLUSH_FILES files, and at the end):
store flushed first, then stale rows deleted, then the manifest written, exactly as the local
writer does. A driver SIGKILLed at any point leaves files either recorded with all their rows
durable, or unrecorded (the rerun redoes them; ids are deterministic, upserts idempotent).
Ctrl-C stops the dataset; files already acknowledged are recorded, the rest fail
"interrupted" (and lose the rows some of their parts stored, never their last good copy). An
error in the dataset (an encode pool that cannot start) stops the run with one line (RunError);
a store that does not answer stops it with a StoreError.

NOTE (faults): per-file timeouts and crash isolation are the loader pools' own, inside each
load task (Ray has no task timeout). Ray restarts a dead encode or writer actor and retries
its batch (Ray Data's actor defaults: max_restarts=-1, max_task_retries=-1); the ids are
deterministic, so a batch written twice leaves the same rows.
"""
from __future__ import annotations

import math
import os
import pickle
import queue
import signal
import sys
import threading
import time
from collections import defaultdict
from dataclasses import replace
from typing import Any, Iterator

from ingest import load, remote
from ingest.config import ConfigError, FORMAT_POOLS
from ingest.files import INTERRUPTED, FileRef, Finished, Outcome, Times
from ingest.loaders import pool_for
from ingest.engines.ray_stages import EncodeParts, LoadSettings, PartAck, WriteParts, dumps, load_files
from ingest.engines.run import Run, RunError
from ingest.engines.stop import SIGNALS
from ingest.store import StoreError, is_local
from ingest.timeline import unmeasured
from ingest.workers.limits import usable_cores
from ingest.write import FLUSH_EVERY_S, FLUSH_FILES, FLUSH_ROWS, Ledger

TASKS_PER_SLOT = 4           # load tasks per CPU slot of a pool: enough to balance, few enough to amortize a task
FILES_PER_TASK = (4, 256)    # files per load task, at least and at most (a Ray task costs ~10 ms of CPU in all)
BYTES_PER_TASK = 64 * 2 ** 20   # at most this much file data per task, on average
PACKS_PER_ENCODE = 2         # rows of up to 256 chunks per encode call: the encode stage starts after 2 packs, not 8
PACKS_PER_WRITE = 1          # a writer call per encode call (with 4 the first rows waited for 4: 19.8 -> 14.8 s at 10k)
FORWARD_ENV = ("PYTHONPATH", "HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM", "MALLOC_ARENA_MAX")
_END = object()


def files_per_task(jobs: list[load.Job], slots: float) -> int:
    """Files per load task of a pool with `slots` CPU slots: TASKS_PER_SLOT tasks a slot, within FILES_PER_TASK
    and BYTES_PER_TASK (sized by bytes: a few big files a task, many tiny ones)."""
    least, most = FILES_PER_TASK
    average = sum(job.ref.size for job in jobs) / len(jobs)
    most = max(1, min(most, int(BYTES_PER_TASK // max(average, 1))))
    return max(min(least, most), min(most, math.ceil(len(jobs) / (TASKS_PER_SLOT * max(slots, 1)))))


class RayRun(Run):
    """The run with Ray Data as its engine (see NOTE)."""

    def check(self) -> None:
        if is_local(self.cfg["store"]["uri"]) and self.cfg["ray"]["address"]:
            raise ConfigError(f"store {self.cfg['store']['uri']} is a Milvus Lite file, which only this machine can "
                              "write; with [ray] address set, use a Milvus server URI (--store http://host:19530)")

    def ingest(self, files: Iterator[tuple[FileRef, Outcome | None]]) -> None:
        files = list(files)                   # the driver still plans every file first (its rework: issue 22 item 5)
        col = self.col
        self.ledger = Ledger(col.store, col.manifest, col.settings)
        self._parts: dict[int, int] = defaultdict(int)         # seq -> parts acknowledged
        self._spent: dict[int, Times] = defaultdict(Times)     # seq -> its acknowledged parts' encode and write seconds
        self._open = {ref.seq: ref for ref, _ in files}         # not settled yet (settle() forgets what ends)
        self._done: set[int] = set()                            # files in the ledger or written
        self._encoders: dict[str, int] = defaultdict(int)       # Ray node id -> rows it encoded
        self._first_row_at: float | None = None                 # perf_counter of the first acknowledged rows
        jobs: dict[str, list[load.Job]] = defaultdict(list)
        for ref, problem in files:
            job = load.plan(ref, problem, col.known.get(ref.source), col.settings, self.cfg["limits"]["max_file_mb"])
            if isinstance(job, Finished):
                self._file_done(load.drop_if_skipped(job, col.known))
            else:
                jobs[pool_for(job.ref.fmt)].append(job)
        try:
            if jobs:
                col.store.ensure_collection(col.model.name, col.model.dim, col.backend)
                self._stream(jobs)
            if not isinstance(self._fatal, StoreError):
                self._commit()
        except StoreError as exc:
            self._fatal = exc

    def _commit(self) -> None:
        for file in self.ledger.commit():
            self.settle(file)

    def _stream(self, jobs: dict[str, list[load.Job]]) -> None:
        try:
            dataset = self._dataset(jobs)
        except Exception as exc:
            where = self.cfg["ray"]["address"] or "a local Ray"
            self._fatal = RunError(f"cannot start the Ray engine on {where}: {' '.join(str(exc).split())[:300]}; "
                                   "check [ray] address (and that `ray status` answers there)")
            return
        acks: queue.Queue = queue.Queue()
        consumer = threading.Thread(target=self._consume, args=(dataset, acks), name="ingest-ray-acks",
                                    daemon=True)
        consumer.start()
        rows_since, last_flush = 0, time.monotonic()
        while not self.stopping.is_set():
            try:
                item = acks.get(timeout=0.5)
            except queue.Empty:
                item = None
            if item is _END:
                break
            if isinstance(item, BaseException):
                self._fatal = item if isinstance(item, StoreError) else RunError(
                    f"the Ray dataset stopped the run: {' '.join(str(item).split())[:300]}")
                break
            try:
                for ack in item or ():
                    rows_since += self._acknowledged(ack)
                self.col.check_lease()
                if self.ledger.files and (rows_since >= FLUSH_ROWS or len(self.ledger.files) >= FLUSH_FILES
                                          or time.monotonic() - last_flush > FLUSH_EVERY_S):
                    self._commit()
                    rows_since, last_flush = 0, time.monotonic()
            except StoreError as exc:
                self._fatal = exc
                break
        if self.stopping.is_set() and not self.quiet:
            print("\ninterrupted: recording the files already written (Ctrl-C again to quit at once)",
                  file=sys.stderr)
        if self.stopping.is_set() or self._fatal is not None:
            self._shutdown_ray()                 # stops the dataset; the consumer ends with it
        consumer.join(timeout=10)
        if self.stopping.is_set():                # a file with some rows stored loses them, not its last good copy
            for seq, ref in list(self._open.items()):
                if seq not in self._done:
                    if ref.source in self.ledger.touched:
                        self.ledger.failed.setdefault(ref.source, INTERRUPTED)
                    entry = self.col.known.get(ref.source)
                    self._file_done(Finished(ref, Outcome("failed", INTERRUPTED),
                                             old_hash=entry.file_hash if entry else None))

    def _acknowledged(self, ack: PartAck) -> int:
        """Count a part of its file; the file joins the ledger once all its parts are in. Rows stored."""
        source = ack.file.ref.source
        if ack.unreachable:
            raise StoreError(ack.error)
        if ack.rows:
            self._first_row_at = self._first_row_at or time.perf_counter()
            self.ledger.touched.add(source)
            self._encoders[ack.encoder] += ack.rows
        if ack.error:
            self.ledger.failed.setdefault(source, ack.error)
        seq = ack.file.ref.seq
        self._parts[seq] += 1
        self._spent[seq] += Times(encode=ack.encode_s, write=ack.write_s)
        if self._parts[seq] == ack.count:
            outcome = ack.file.outcome
            self._file_done(replace(ack.file, outcome=replace(outcome, times=outcome.times + self._spent.pop(seq))))
        return ack.rows

    def _file_done(self, file: Finished) -> None:
        self._done.add(file.ref.seq)
        self.ledger.files.append(file)
        self.progress.embedded(file.outcome.chunks if file.outcome.status == "ingested" else 0)

    def _consume(self, dataset: Any, out: queue.Queue) -> None:
        """Thread target: the dataset's acknowledgements onto `out`, then _END (or the exception)."""
        try:
            for batch in dataset.iter_batches(batch_size=None, batch_format="numpy"):
                out.put([ack for blob in batch["ack"] for ack in pickle.loads(blob)])
            out.put(_END)
        except BaseException as exc:
            out.put(exc)

    # -- Ray ------------------------------------------------------------------------
    def _dataset(self, jobs: dict[str, list[load.Job]]) -> Any:
        import ray
        import ray.data

        r, col = self.cfg["ray"], self.col
        self._connect()
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        context.print_on_execution_start = False
        settings = LoadSettings(self.loader_options, self.ocr_options, self.spec, tuple(self.cfg["loaders"]["plugins"]),
                                self.cfg["limits"]["worker_memory_mb"],
                                tuple((p, float(self.cfg["loaders"][p]["timeout_s"])) for p in FORMAT_POOLS))
        loaded = []
        for pool, items in jobs.items():
            cpus = r["loader_cpus"].get(pool, 1.0)          # a plugin's pool of its own: 1
            # OCR in a load task runs on the CPUs the task reserves, not on the driver's share of its cores.
            here = replace(settings, ocr_options=replace(settings.ocr_options, threads=max(1, round(cpus))))
            blocks = math.ceil(len(items) / files_per_task(items, ray.cluster_resources().get("CPU", 1) / cpus))
            ds = ray.data.from_items([{"job": dumps(job)} for job in items], override_num_blocks=blocks)
            loaded.append(ds.map_batches(load_files, fn_kwargs={"settings": here}, batch_size=None, num_cpus=cpus))
        ds = loaded[0].union(*loaded[1:]) if len(loaded) > 1 else loaded[0]
        gpus = self._encode_gpus()
        actors = r["encode_actors"]
        if actors == "auto":
            actors = max(1, int(ray.cluster_resources().get("GPU", 0) // gpus)) if gpus else 1
        model_settings = {**self.cfg["model"], "backend": col.backend}
        if gpus:
            model_settings["devices"] = "auto"           # the actor sees only its own GPUs
        ds = ds.map_batches(EncodeParts, fn_constructor_args=(col.model, model_settings), batch_size=PACKS_PER_ENCODE,
                            compute=ray.data.ActorPoolStrategy(size=actors),
                            num_gpus=gpus, num_cpus=r["encode_cpus"])
        return ds.map_batches(WriteParts, fn_constructor_args=(col.store.endpoint(), self.cfg["store"]["batch_size"]),
                              batch_size=PACKS_PER_WRITE, compute=ray.data.ActorPoolStrategy(size=r["writers"]),
                              num_cpus=r["writer_cpus"])

    def _encode_gpus(self) -> float:
        import ray

        gpus = self.cfg["ray"]["encode_gpus"]
        if gpus == "auto":
            return 1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0
        return float(gpus)

    def _connect(self) -> None:
        """Join [ray] address, or start a local Ray for this run. Ray's workers get this process's
        INGEST_* settings and PYTHONPATH (plugins), and never go online for a model."""
        import logging

        import ray

        if ray.is_initialized():
            return
        r = self.cfg["ray"]
        prefixes = ("INGEST_", *remote.forwarded_env(self.root))      # a URL's credentials and endpoint
        env = {k: v for k, v in os.environ.items() if k.startswith(prefixes) or k in FORWARD_ENV}
        env.setdefault("HF_HUB_OFFLINE", "1")
        kwargs: dict[str, Any] = dict(runtime_env={"env_vars": env}, log_to_driver=False,
                                      logging_level=logging.ERROR, configure_logging=True)
        if r["address"]:
            kwargs["address"] = r["address"]
        else:
            # The actors' CPUs are counted on top of the cores, so load tasks always have CPUs to run on.
            actors = 1 if r["encode_actors"] == "auto" else r["encode_actors"]
            cpus = r["cpus"] or math.ceil(usable_cores() + r["encode_cpus"] * actors + r["writer_cpus"] * r["writers"])
            kwargs.update(address="local", num_cpus=cpus, include_dashboard=False,
                          object_store_memory=r["object_store_mb"] * 2 ** 20)
        # A Ray started here installs its own SIGTERM handler (kill Ray, exit 1): the run's stop handlers
        # (ingest/engines/stop.py) come back, so SIGTERM still writes the report and exits 143; close() stops Ray.
        handlers = {s: signal.getsignal(s) for s in SIGNALS}
        try:
            ray.init(**kwargs)
        finally:
            if threading.current_thread() is threading.main_thread():
                for s, handler in handlers.items():
                    signal.signal(s, handler)
        logging.getLogger("ray").setLevel(logging.ERROR)
        logging.getLogger("ray.data").setLevel(logging.ERROR)

    def _shutdown_ray(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()

    # -- the Run's hooks ------------------------------------------------------------
    def close(self) -> None:
        self._shutdown_ray()

    def engine_totals(self) -> dict[str, Any]:
        first = getattr(self, "_first_row_at", None)
        return {"engine": "ray", "rows_by_encoder_node": dict(getattr(self, "_encoders", {})),
                "first_row_s": round(first - self.started, 3) if first else None,
                "timeline": unmeasured("the Ray engine does not measure one; each file's line has its stages' "
                                        "seconds")}
