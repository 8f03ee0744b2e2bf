"""`ingest run --engine ray`: the same run on Ray, on one machine or a cluster.

The driver (this process) pulls the lazy scan and records results as the local engine does
(`ingest.engines.run.Run`: same report, exit codes, incremental semantics); only `ingest` differs. It
settles what needs no loader from the scan's stat alone (unchanged by size and mtime, a scan problem)
and sends the rest, with their manifest entries, in load tasks: Ray generator tasks, reserving their
pool's [ray.loader_cpus], that sniff, load and chunk the files and yield packs of parts as they fill.
Each pack goes, as an object reference the driver never fetches, to the encode actor with the fewest
packs outstanding ([ray] encode_actors, each with encode_gpus GPUs), and its vectors to a writer actor
([ray] writers), whose acknowledgements the driver fetches. The stages are `ingest.engines.ray_stages`.
Ray starts with the first file that needs a loader, so an unchanged rerun never starts it.

NOTE (driver protocol): the main thread alone drives. It pulls the scan while fewer than
TASKS_PER_SLOT load tasks per CPU slot run and fewer than FLUSH_FILES files wait in the ledger; a
task goes out once it has its files (the first tasks TASK_FILES' least, doubling to its most,
within BYTES_PER_TASK) or the scan ends or its first file waited BATCH_WAIT_S. It takes the next
pack of a load task only while fewer than PACKS_PER_ENCODER packs per encode actor are
unacknowledged (the task pauses GENERATOR_AHEAD packs ahead; these are in ray_flow.py), so driver
and object store memory are bounded whatever the folder's or a file's size. Every `ray.wait` has a
timeout (0.5 s), after which it checks Ctrl-C, the lease and the flush timer. Each acknowledgement
counts a part of its file; a file whose parts are all in joins the Ledger, which records it at the
next flush (every FLUSH_EVERY_S, FLUSH_ROWS rows or FLUSH_FILES files, and at the end): store
flushed first, then stale rows deleted, then the manifest written, exactly as the local writer does.
A driver SIGKILLed at any point leaves files either recorded with all their rows durable, or
unrecorded (the rerun redoes them; ids are deterministic, upserts idempotent). Ctrl-C stops intake
and Ray; files already acknowledged are recorded, the rest fail "interrupted" (and lose the rows
some of their parts stored, never their last good copy). A stage that raises (an encode pool that
cannot start) stops the run with one line (RunError); a store that does not answer, with a StoreError.

NOTE (faults and bounds): per-file timeouts and crash isolation are the loader pools' own, inside each
load task (Ray has no task timeout). Neither Ray retries a call (max_task_retries=0, a load task's
max_retries=0); Ray restarts an actor that ends (max_restarts=-1) and the driver sends again:
- a pack whose actor ended goes again alone (nothing else in flight, once every actor answers
  `__ray_ready__`: a call to a restarting actor fails unrun), so an end is its own; after PACK_DEATHS
  ends a pack of several files is split, each file's parts alone with one end left; a file's pack that
  ends then fails the file (the rows its writer may have stored go, its last good copy stays). Actors
  with calls in flight that answer none for Flow.silent_s (2 x [model] timeout_s + 2 x [store]
  timeout_s: a batch and its retry, an upsert and its retry) are killed, which is an end. The run
  stops (RunError) when DEAD_PACKS_IN_A_ROW packs fail that way with none answered between, or when
  the actors do not answer silent_s after an end.
- a load task that raises or dies yields that error as its next pack; once its packs are answered, its
  files not all in go again, each in a load task of its own, and a file alone in a failed task fails.
- ray.get has a timeout (GET_S) everywhere, and ray.wait 0.5 s. A load task makes no fetch folder
  for local files, and sweeps those of dead Ray workers (ray_stages.py). The ids are deterministic,
  so a pack written twice leaves the same rows, and a part acknowledged twice counts once.
"""
from __future__ import annotations

import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath
from typing import Any, Iterator

from ingest import load
from ingest.config import ConfigError, FORMAT_POOLS
from ingest.engines.ray_flow import DEAD_PACKS_IN_A_ROW, PACK_DEATHS, Call, Flow, Task, connect
from ingest.engines.ray_stages import LoadSettings, PartAck
from ingest.engines.run import Run, RunError
from ingest.files import INTERRUPTED, FileRef, Finished, Outcome, Times
from ingest.loaders import format_for_extension, pool_for
from ingest.sniff import unchanged
from ingest.store import StoreError, is_local, kind, redact
from ingest.timeline import unmeasured
from ingest.ledger import Ledger
from ingest.write import FLUSH_EVERY_S, FLUSH_FILES, FLUSH_ROWS

BYTES_PER_TASK = 64 * 2 ** 20   # at most this much file data per task
BATCH_WAIT_S = 1.0           # a task's files go out after this long even if it is not full (a slow listing)
GET_S = 60.0                 # a ray.get of an answer Ray says is ready, or of a failed call's pack


@dataclass
class _Sent:
    """A file sent to Ray: its parts acknowledged, their encode and write seconds, its last part's answer."""
    parts: set[int] = field(default_factory=set)
    spent: Times = field(default_factory=Times)
    last: PartAck | None = None


@dataclass
class _Batch:
    """The files of the next load task of a pool."""
    files: list[tuple[FileRef, Any]] = field(default_factory=list)
    bytes: int = 0
    since: float = field(default_factory=time.monotonic)


class RayRun(Run):
    """The run with Ray as its engine (see NOTE)."""

    tree_cpu = False        # Ray's processes are its raylet's (and other nodes'): no cpu_s, only a PDF page's CPU

    def check(self) -> None:
        uri = redact(self.cfg["store"]["uri"])
        if kind(uri) == "qdrant-local":
            raise ConfigError(f"store {uri} is Qdrant's local mode, which only the run's own process may open, not "
                              "Ray's writers; use --engine local, or a Qdrant server (--store qdrant://host:6333)")
        if is_local(uri) and self.cfg["ray"]["address"]:
            what = "a Milvus Lite file" if kind(uri) == "milvus-lite" else "a LanceDB folder"
            raise ConfigError(f"store {self.cfg['store']['uri']} is {what}, which only this machine can "
                              "write; with [ray] address set, use a Milvus server URI (--store http://host:19530)")

    def ingest(self, files: Iterator[tuple[FileRef, Outcome | None]]) -> None:
        self.ledger = Ledger(self.col.store, self.col.manifest, self.col.settings)
        self._waiting: dict[int, _Sent] = {}                # seq -> its parts acknowledged, for files sent to Ray
        self._rows_by_node: dict[str, int] = defaultdict(int)
        self._first_row_at: float | None = None             # perf_counter of the first acknowledged rows
        self._batches: dict[str, _Batch] = {}
        self._flow: Flow | None = None                       # once Ray is up: the load tasks and actors in flight
        try:
            self._stream(files)
            if not isinstance(self._fatal, StoreError):
                self._commit()
        except StoreError as exc:
            self._fatal = exc

    def _commit(self) -> None:
        for file in self.ledger.commit():
            self.settle(file)
        self.ledger.check_room()

    def _stream(self, files: Iterator[tuple[FileRef, Outcome | None]]) -> None:
        exhausted, rows_since, last_flush = False, 0, time.monotonic()
        try:
            while not self.stopping.is_set():
                if not exhausted:
                    exhausted = self._intake(files)
                if exhausted and (self._flow is None or self._flow.idle):
                    break
                rows_since += self._pump()
                self.col.check_lease()
                if self.ledger.files and (rows_since >= FLUSH_ROWS or len(self.ledger.files) >= FLUSH_FILES
                                          or time.monotonic() - last_flush > FLUSH_EVERY_S):
                    self._commit()
                    rows_since, last_flush = 0, time.monotonic()
        except StoreError as exc:
            self._fatal = exc
        except _StageError as exc:
            self._fatal = RunError(str(exc))
        if self.stopping.is_set() and not self.quiet:
            print("\ninterrupted: recording the files already written (Ctrl-C again to quit at once)",
                  file=sys.stderr)
        if self.stopping.is_set() or self._fatal is not None:
            self._shutdown_ray()
        if self.stopping.is_set():                # a file with some rows stored loses them, not its last good copy
            for seq in sorted(self._waiting):
                self._fail(seq, INTERRUPTED)

    # -- intake: the scan into load tasks --------------------------------------------
    def _intake(self, files: Iterator[tuple[FileRef, Outcome | None]]) -> bool:
        """Pull the scan until the load tasks in flight reach their bound, or FLUSH_FILES files wait in the ledger
        (an unchanged rerun's files settle as it goes); whether the scan ended."""
        while ((self._flow is None or len(self._flow.loads) < self._flow.most_loads)
               and len(self.ledger.files) < FLUSH_FILES):
            for pool in [p for p, b in self._batches.items() if time.monotonic() - b.since > BATCH_WAIT_S]:
                self._submit(pool)
            item = next(files, None)
            if item is None:
                for pool in list(self._batches):
                    self._submit(pool)
                return True
            ref, problem = item
            entry = self.col.known.get(ref.source)
            decided = self._decided(ref, problem, entry)
            if isinstance(decided, Finished):
                self._file_done(decided)
                continue
            self._open[ref.seq], self._waiting[ref.seq] = ref, _Sent()
            batch = self._batches.setdefault(decided, _Batch())
            batch.files.append((ref, entry))
            batch.bytes += ref.size
            flow = self._flow or self._start()
            if len(batch.files) >= flow.task_files or batch.bytes >= BYTES_PER_TASK:
                self._submit(decided)
        return False

    def _decided(self, ref: FileRef, problem: Outcome | None, entry: Any) -> Finished | str:
        """The file as it ends without a loader (a scan problem, unchanged by size and mtime, a name no loader
        claims and content none reads), else the loader pool of the task it goes in."""
        if problem is None and (same := unchanged(ref, entry, self.col.settings)) is not None:
            return same
        fmt = None if problem else format_for_extension(PurePosixPath(ref.source).suffix)
        if fmt is None:                           # sniffed here: rare, and it picks the task's pool
            job = load.plan(ref, problem, entry, self.col.settings, self.cfg["limits"]["max_file_mb"])
            if isinstance(job, Finished):
                return load.drop_if_skipped(job, self.col.known)
            fmt = job.ref.fmt
        return pool_for(fmt)

    def _submit(self, pool: str) -> None:
        self._flow.load(pool, tuple(self._batches.pop(pool).files))

    # -- the stages' answers ---------------------------------------------------------
    def _pump(self) -> int:
        """Wait up to 0.5 s for packs and acknowledgements; send the packs on, count the acknowledgements, send
        again what an actor's end or a load task's failure left (NOTE: bounds). Rows stored."""
        import ray

        flow = self._flow
        if flow is not None and flow.send_again():
            raise _StageError(f"the Ray engine stopped the run: its actors did not answer {flow.silent_s:.0f} s after "
                              "one ended; see their logs in the Ray session's logs folder")
        waitables = flow.waitables() if flow is not None else []
        if not waitables:
            return 0
        ready, _ = ray.wait(waitables, num_returns=len(waitables), timeout=0)
        ready = ready or ray.wait(waitables, num_returns=1, timeout=0.5)[0]
        rows = 0
        for item in ready:
            if item in flow.calls:
                call = flow.answered(item)
                try:
                    acks = ray.get(item, timeout=GET_S)
                except ray.exceptions.RayError as exc:
                    acks = self._failed(call, exc)
                else:
                    flow.done(call)
                    flow.dead_packs = 0
                for ack in acks:
                    rows += self._acknowledged(ack)
            elif flow.has_room():
                try:
                    flow.send(next(item), flow.loads[item])
                except StopIteration:
                    flow.exhausted(item)
        flow.kill_silent()
        while flow.ended:
            self._resolve(flow.ended.pop())
        return rows

    def _failed(self, call: Call, exc: BaseException) -> list[PartAck]:
        """A writer call that answered an error: its pack is its load task's error (the task's files go again,
        each alone), or an actor ended (the pack goes again alone, or after PACK_DEATHS ends its files fail), or
        a stage raised (the run stops). The acknowledgements that fail the pack's files, if it comes to that."""
        import ray

        flow = self._flow
        try:
            parts = ray.get(call.pack, timeout=GET_S)
        except ray.exceptions.RayError as load_exc:
            flow.done(call, f"its Ray load task failed: {_cause(load_exc)}")
            return []
        if not isinstance(exc, (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError)):
            raise _StageError(f"the Ray engine stopped the run: {_first_line(exc)}")
        call.deaths += 1
        if call.deaths < PACK_DEATHS:
            flow.again.append(call)
            return []
        files: dict[int, list[Any]] = defaultdict(list)
        for p in parts:
            files[p.file.ref.seq].append(p)
        if len(files) > 1:                       # which file ends it: each goes again alone, with one end left
            flow.split(call, [ray.put(tuple(group)) for group in files.values()])
            return []
        flow.done(call)
        if call.silent:
            ended = f"encode and writer actors were silent for {flow.silent_s:.0f} s, and killed,"
        else:
            ended = f"{flow.actor_kind(exc, call)} actor ended"
        flow.dead_packs += 1
        if flow.dead_packs >= DEAD_PACKS_IN_A_ROW:
            raise _StageError(f"the Ray engine stopped the run: the {ended} {PACK_DEATHS} times on each of "
                              f"{DEAD_PACKS_IN_A_ROW} packs in a row; see the actors' logs in the Ray session's "
                              "logs folder")
        error = f"the {ended} {PACK_DEATHS} times with this file's chunks"
        if not call.silent:
            error += f" ({_cause(exc)})"
        for p in parts:                          # rows its writer stored before it ended go with the file
            self.ledger.touched.add(p.file.ref.source)
        return [PartAck(p.file, p.index, p.count, 0, error) for p in parts]

    def _resolve(self, task: Task) -> None:
        """A load task whose packs are all answered: its files not all in go again, each in a task of its own;
        a file that was alone in its task fails with its error."""
        for ref, entry in task.files:
            if ref.seq not in self._waiting:
                continue
            if task.error is None or task.alone:
                self._fail(ref.seq, task.error or "its Ray load task ended without its last part")
            else:
                self._flow.load(task.pool, ((ref, entry),), alone=True)

    def _fail(self, seq: int, error: str) -> None:
        """A file sent to Ray that ends without all its parts: failed; its rows some parts stored go (its last
        good copy stays)."""
        ref = self._open[seq]
        del self._waiting[seq]
        if ref.source in self.ledger.touched:
            self.ledger.failed.setdefault(ref.source, error)
        entry = self.col.known.get(ref.source)
        self._file_done(Finished(ref, Outcome("failed", error), old_hash=entry.file_hash if entry else None))

    def _acknowledged(self, ack: PartAck) -> int:
        """Count a part of its file; the file joins the ledger once all its parts are in (their number comes
        with the last, which carries the file's outcome). Rows stored."""
        seq, source = ack.file.ref.seq, ack.file.ref.source
        if ack.unreachable:
            raise StoreError(ack.error)
        state = self._waiting.get(seq)
        if state is None or ack.index in state.parts:   # a retried task's part, already counted
            return 0
        if ack.rows:
            self._first_row_at = self._first_row_at or time.perf_counter()
            self.ledger.touched.add(source)
            self._rows_by_node[ack.encoder] += ack.rows
        if ack.error:
            self.ledger.failed.setdefault(source, ack.error)
        state.parts.add(ack.index)
        state.spent += Times(encode=ack.encode_s, write=ack.write_s)
        if ack.count:
            state.last = ack
        if state.last is not None and len(state.parts) == state.last.count:
            del self._waiting[seq]
            file = state.last.file
            self._file_done(replace(file, outcome=replace(file.outcome, times=file.outcome.times + state.spent)))
        return ack.rows

    def _file_done(self, file: Finished) -> None:
        self.ledger.files.append(file)
        self.progress.embedded(file.outcome.chunks if file.outcome.status == "ingested" else 0)

    # -- Ray ------------------------------------------------------------------------
    def _start(self) -> Flow:
        """Ray, its actors and the collection, at the first file that needs a loader (the collection is made
        ready in a thread meanwhile Ray starts: each takes seconds)."""
        where = self.cfg["ray"]["address"] or "a local Ray"
        failed: list[BaseException] = []
        col = self.col
        thread = threading.Thread(target=_ensure, args=(col, failed), name="ingest-collection", daemon=True)
        thread.start()
        try:
            connect(self.cfg, self.root)
            settings = LoadSettings(self.loader_options, self.ocr_options, self.spec,
                                    tuple(self.cfg["loaders"]["plugins"]), self.cfg["limits"]["worker_memory_mb"],
                                    tuple((p, float(self.cfg["loaders"][p]["timeout_s"])) for p in FORMAT_POOLS),
                                    col.settings, float(self.cfg["limits"]["max_file_mb"]))
            self._flow = Flow(self.cfg, col, settings)
        except Exception as exc:
            raise _StageError(f"cannot start the Ray engine on {where}: {_first_line(exc)}; "
                              "check [ray] address (and that `ray status` answers there)") from None
        finally:
            thread.join()
        if failed:
            raise failed[0]
        return self._flow

    def _shutdown_ray(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()

    # -- the Run's hooks ------------------------------------------------------------
    def close(self) -> None:
        self._shutdown_ray()

    def engine_totals(self) -> dict[str, Any]:
        first = getattr(self, "_first_row_at", None)
        return {"engine": "ray", "rows_by_encoder_node": dict(getattr(self, "_rows_by_node", {})),
                "first_row_s": round(first - self.started, 3) if first else None,
                "timeline": unmeasured("the Ray engine does not measure one; each file's line has its stages' "
                                        "seconds")}


class _StageError(Exception):
    """A Ray stage or Ray itself stopped the run (one line)."""


def _ensure(col: Any, failed: list[BaseException]) -> None:
    """Thread target: the collection ready for rows (a StoreError goes to `failed`)."""
    try:
        col.store.ensure_collection(col.model.name, col.model.dim, col.backend)
    except BaseException as exc:
        failed.append(exc)


def _first_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


def _cause(exc: BaseException) -> str:
    """Ray's reason a task or actor ended, in a few words (its last line, without the task's context)."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    last = (lines[-1] if lines else type(exc).__name__).removeprefix("ray.exceptions.")
    return " ".join(last.split(" The task may or may not")[0].split())[:200]
