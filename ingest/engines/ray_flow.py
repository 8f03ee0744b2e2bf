"""The Ray engine's side in Ray (`ray_driver.RayRun` drives it): a load task per loader pool, the encode and
writer actors, and how many packs each actor has outstanding. Constants: ray_driver's NOTE."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from ingest.config import FORMAT_POOLS
from ingest.engines.ray_stages import EncodeParts, LoadSettings, WriteParts, load_files
from ingest.files import FileRef

TASK_FILES = (8, 256)        # files per load task: the first tasks small (first rows soon), doubling to the most
TASKS_PER_SLOT = 2           # load tasks in flight per CPU slot of a pool: one running, one queued behind it
PACKS_PER_ENCODER = 4        # packs sent to an encode actor whose writer has not answered yet
GENERATOR_AHEAD = 4          # packs a load task yields before it waits for the driver to take them


class Flow:
    """The run's Ray side: the load task per pool, the encode and writer actors, and how busy each is."""

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
        restart = dict(max_restarts=-1, max_task_retries=-1)
        encoder = ray.remote(EncodeParts).options(num_cpus=r["encode_cpus"], num_gpus=float(gpus), **restart)
        writer = ray.remote(WriteParts).options(num_cpus=r["writer_cpus"], **restart)
        self.encoders = [encoder.remote(col.model, model_settings) for _ in range(actors)]
        self.writers = [writer.remote(col.store.endpoint(), cfg["store"]["batch_size"]) for _ in range(r["writers"])]
        self.busy = [[0] * actors, [0] * r["writers"]]   # packs outstanding per encode actor, per writer
        self.loads: list[Any] = []                        # load tasks' ObjectRefGenerators, not yet exhausted
        self.calls: dict[Any, tuple[int, int]] = {}       # a writer call's ref -> (its encode actor, its writer)
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
        return not self.loads and not self.calls

    def load(self, pool: str, files: tuple[tuple[FileRef, Any], ...]) -> None:
        """A load task for `files` (with their manifest entries) in `pool`; its packs come through `loads`."""
        self.submitted += 1
        if pool not in self._pools:
            need = self._loader_cpus.get(pool, 1.0)       # a plugin's pool of its own: 1
            # OCR in a load task runs on the CPUs the task reserves, not on the driver's share of its cores.
            here = replace(self._settings, ocr_options=replace(self._settings.ocr_options, threads=max(1, round(need))))
            self._pools[pool] = (self._task.options(num_cpus=need, _generator_backpressure_num_objects=GENERATOR_AHEAD),
                                 here)
        task, settings = self._pools[pool]
        self.loads.append(task.remote(files, settings))

    def has_room(self) -> bool:
        return len(self.calls) < PACKS_PER_ENCODER * len(self.encoders)

    def waitables(self) -> list[Any]:
        """What the driver waits on: the writers' answers, and the load tasks while a pack may be sent on."""
        return list(self.calls) + (self.loads if self.has_room() else [])

    def send(self, pack: Any) -> None:
        """The pack (a reference) to the least busy encode actor, its vectors to the least busy writer, whose
        answer joins `calls`."""
        busy_e, busy_w = self.busy
        e, w = busy_e.index(min(busy_e)), busy_w.index(min(busy_w))
        busy_e[e] += 1
        busy_w[w] += 1
        self.calls[self.writers[w].write.remote(self.encoders[e].encode.remote(pack))] = (e, w)

    def answered(self, call: Any) -> None:
        """`call`, a writer's answer, is ready: its actors have a pack less outstanding."""
        e, w = self.calls.pop(call)
        self.busy[0][e] -= 1
        self.busy[1][w] -= 1
