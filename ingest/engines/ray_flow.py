"""The Ray engine's side in Ray (`ray_driver.RayRun` drives it): Ray joined or started (`connect`), a load task
per loader pool, the encode and writer actors, the packs in flight, and the packs and load tasks to run again
after a fault. Constants and bounds: ray_driver's NOTEs."""
from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ingest import remote
from ingest.config import FORMAT_POOLS
from ingest.engines.ray_stages import EncodeParts, LoadSettings, WriteParts, load_files
from ingest.engines.stop import SIGNALS
from ingest.files import FileRef
from ingest.workers.limits import usable_cores

TASK_FILES = (8, 256)        # files per load task: the first tasks small (first rows soon), doubling to the most
TASKS_PER_SLOT = 2           # load tasks in flight per CPU slot of a pool: one running, one queued behind it
PACKS_PER_ENCODER = 4        # packs sent to an encode actor whose writer has not answered yet
GENERATOR_AHEAD = 4          # packs a load task yields before it waits for the driver to take them
PACK_DEATHS = 3              # times a pack's actor may end (die, or be killed as silent) before its files fail
DEAD_PACKS_IN_A_ROW = 3      # packs failed that way with no pack answered between: the actors are broken, not the packs

FORWARD_ENV = ("PYTHONPATH", "HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM", "MALLOC_ARENA_MAX")


@dataclass(eq=False)
class Task:
    """A load task: its files (with their manifest entries), whether it holds one file alone (a retry), its packs
    not yet answered, and how it ended."""
    pool: str
    files: tuple[tuple[FileRef, Any], ...]
    alone: bool
    packs: int = 0
    ended: bool = False
    error: str | None = None                          # it raised or its process died: this is the error


@dataclass(eq=False)
class Call:
    """A pack (a reference, never fetched unless it fails) in flight: its load task, actors and the actor ends
    it has seen."""
    pack: Any
    task: Task
    encoder: int = 0
    writer: int = 0
    deaths: int = 0
    silent: bool = False                              # its last end: its actors were killed as silent


class Flow:
    """The run's Ray side: the load tasks, the encode and writer actors, and what each has in flight."""

    def __init__(self, cfg: dict[str, Any], col: Any, settings: LoadSettings):
        import ray

        r, cpus = cfg["ray"], ray.cluster_resources().get("CPU", 1)
        gpus = r["encode_gpus"]
        if gpus == "auto":
            gpus = 1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0
        actors = r["encode_actors"]
        if actors == "auto":
            actors = max(1, int(ray.cluster_resources().get("GPU", 0) // gpus)) if gpus else 1
        model_settings = {**cfg["model"], "backend": col.backend}
        if gpus:
            model_settings["devices"] = "auto"           # the actor sees only its own GPUs
        # Ray restarts an actor that ends; the driver, not Ray, sends its calls again (PACK_DEATHS).
        restart = dict(max_restarts=-1, max_task_retries=0)
        encoder = ray.remote(EncodeParts).options(num_cpus=r["encode_cpus"], num_gpus=float(gpus), **restart)
        writer = ray.remote(WriteParts).options(num_cpus=r["writer_cpus"], **restart)
        self.encoders = [encoder.remote(col.model, model_settings) for _ in range(actors)]
        self.writers = [writer.remote(col.store.endpoint(), cfg["store"]["batch_size"]) for _ in range(r["writers"])]
        self.busy = [[0] * actors, [0] * r["writers"]]   # packs outstanding per encode actor, per writer
        self.loads: dict[Any, Task] = {}                  # load tasks' ObjectRefGenerators, not yet exhausted
        self.calls: dict[Any, Call] = {}                  # a writer call's ref -> its pack
        self.again: deque[Call] = deque()                 # packs whose actor ended: sent again one at a time, alone
        self.ended: list[Task] = []                       # load tasks exhausted with every pack answered
        # A batch may take [model] timeout_s and be retried once in the actor's pool, an upsert [store] timeout_s:
        # flow calls outstanding and none answered for silent_s, their actors are hung and are killed.
        self.silent_s = 2 * float(cfg["model"]["timeout_s"]) + 2 * float(cfg["store"]["timeout_s"])
        self.answered_at = time.monotonic()
        self.dead_packs = 0                               # packs failed by actor ends since a pack was answered
        self._pings: list[Any] = []                       # each actor's readiness, asked before a pack goes again
        self._back_by = 0.0                               # by when the actors must answer it
        self._task, self._loader_cpus, self._settings = ray.remote(load_files), r["loader_cpus"], settings
        self._pools: dict[str, tuple[Any, LoadSettings]] = {}   # pool -> its task's options and settings
        slots = cpus / min(r["loader_cpus"].get(p, 1.0) for p in FORMAT_POOLS)
        self.most_loads = max(2, math.ceil(TASKS_PER_SLOT * slots))
        self.submitted = 0

    @property
    def task_files(self) -> int:
        least, most = TASK_FILES
        return min(most, least * 2 ** self.submitted)

    @property
    def idle(self) -> bool:
        return not self.loads and not self.calls and not self.again and not self.ended

    def load(self, pool: str, files: tuple[tuple[FileRef, Any], ...], alone: bool = False) -> None:
        """A load task for `files` (with their manifest entries) in `pool`; its packs come through `loads`."""
        self.submitted += 1
        if pool not in self._pools:
            need = self._loader_cpus.get(pool, 1.0)       # a plugin's pool of its own: 1
            # OCR in a load task runs on the CPUs the task reserves, not on the driver's share of its cores.
            here = replace(self._settings, ocr_options=replace(self._settings.ocr_options, threads=max(1, round(need))))
            # No Ray retry: a task that dies or raises fails, and the driver sends its files again, each alone.
            self._pools[pool] = (self._task.options(num_cpus=need, max_retries=0,
                                                    _generator_backpressure_num_objects=GENERATOR_AHEAD), here)
        task, settings = self._pools[pool]
        self.loads[task.remote(files, settings)] = Task(pool, files, alone)

    def has_room(self) -> bool:
        """Whether a new pack may go: none waits to go again, none goes alone, and the actors have room."""
        return (not self.again and not any(c.deaths for c in self.calls.values())
                and len(self.calls) < PACKS_PER_ENCODER * len(self.encoders))

    def waitables(self) -> list[Any]:
        """What the driver waits on: the writers' answers, and the load tasks while a pack may be sent on."""
        return list(self.calls) + (list(self.loads) if self.has_room() else [])

    def send(self, pack: Any, task: Task) -> None:
        """A load task's next pack (a reference) to the actors."""
        task.packs += 1
        self._send(Call(pack, task))

    def send_again(self) -> bool:
        """The first pack whose actor ended, once nothing else is in flight and every actor answers again (a call
        to a restarting actor fails unrun): alone, so an end is its own. Whether the actors are late: not back
        silent_s after the first try."""
        import ray

        if not self.again or self.calls:
            return False
        if not self._pings:
            self._pings = [a.__ray_ready__.remote() for a in (*self.encoders, *self.writers)]
            self._back_by = self._back_by or time.monotonic() + self.silent_s
        ready, _ = ray.wait(self._pings, num_returns=len(self._pings), timeout=0.5)
        if len(ready) < len(self._pings):
            return time.monotonic() > self._back_by
        pings, self._pings = self._pings, []
        try:
            ray.get(pings, timeout=0)
        except ray.exceptions.RayActorError:           # still restarting: ask again
            return time.monotonic() > self._back_by
        self._back_by = 0.0
        self._send(self.again.popleft())
        return False

    def _send(self, call: Call) -> None:
        """The pack to the least busy encode actor, its vectors to the least busy writer, whose answer joins
        `calls`."""
        busy_e, busy_w = self.busy
        call.silent = False
        call.encoder, call.writer = busy_e.index(min(busy_e)), busy_w.index(min(busy_w))
        busy_e[call.encoder] += 1
        busy_w[call.writer] += 1
        if not self.calls:
            self.answered_at = time.monotonic()
        self.calls[self.writers[call.writer].write.remote(self.encoders[call.encoder].encode.remote(call.pack))] = call

    def answered(self, ref: Any) -> Call:
        """`ref`, a writer's answer, is ready: its actors have a pack less outstanding."""
        call = self.calls.pop(ref)
        self.busy[0][call.encoder] -= 1
        self.busy[1][call.writer] -= 1
        self.answered_at = time.monotonic()
        return call

    def split(self, call: Call, packs: list[Any]) -> None:
        """A pack of several files whose actor ended PACK_DEATHS times: each file's parts (`packs`) go again
        alone, failing at their next end."""
        call.task.packs += len(packs) - 1
        self.again.extend(Call(pack, call.task, deaths=PACK_DEATHS - 1) for pack in packs)

    def done(self, call: Call, load_error: str | None = None) -> None:
        """The pack is settled (`load_error`: it is its load task's error); a load task whose every pack is
        settled after its end joins `ended`."""
        task = call.task
        task.packs -= 1
        task.error = task.error or load_error
        self._check(task)

    def exhausted(self, gen: Any) -> None:
        """The load task `gen` yielded its last pack."""
        task = self.loads.pop(gen)
        task.ended = True
        self._check(task)

    def _check(self, task: Task) -> None:
        if task.ended and not task.packs:
            self.ended.append(task)

    def actor_kind(self, exc: BaseException, call: Call) -> str:
        """Which of the call's actors ended, by the error's actor id: "encode" or "writer"."""
        writer = self.writers[call.writer]._actor_id.hex()
        return "writer" if getattr(exc, "actor_id", None) == writer else "encode"

    def kill_silent(self) -> bool:
        """Kill (Ray restarts them) the actors of the calls in flight if none answered for silent_s; whether it did."""
        import ray

        if not self.calls or time.monotonic() - self.answered_at < self.silent_s:
            return False
        for call in self.calls.values():
            call.silent = True
        for e in {c.encoder for c in self.calls.values()}:
            ray.kill(self.encoders[e], no_restart=False)
        for w in {c.writer for c in self.calls.values()}:
            ray.kill(self.writers[w], no_restart=False)
        self.answered_at = time.monotonic()
        return True


def connect(cfg: dict[str, Any], root: str | Path) -> None:
    """Join [ray] address, or start a local Ray for this run. A cluster's workers get this process's
    INGEST_* settings and PYTHONPATH (plugins) as their runtime env; a local Ray's inherit this
    process's environment (a runtime env would cost the first tasks fresh workers: 1.2 s instead of
    0.3), the run's fetch dir included (ray_stages.py). Neither goes online for a model."""
    import ray

    if ray.is_initialized():
        return
    r = cfg["ray"]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    kwargs: dict[str, Any] = dict(log_to_driver=False, logging_level=logging.ERROR, configure_logging=True)
    if r["address"]:
        prefixes = ("INGEST_", *remote.forwarded_env(root))      # a URL's credentials and endpoint
        env = {k: v for k, v in os.environ.items() if k.startswith(prefixes) or k in FORWARD_ENV}
        kwargs.update(address=r["address"], runtime_env={"env_vars": env})
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
