"""Run a command and sample its whole process tree: CPU by process kind and peak RSS per process kind.

Processes of `ingest run` name themselves `ingest-<role>` (ingest-txt, ingest-encode, ingest-writer,
ingest-lite, ...); `role()` reads that name. Shared by bench/feed.py and bench/scale.py.
"""
from __future__ import annotations

import resource
import subprocess
import threading
import time
from pathlib import Path

import psutil

ENCODE_LIBS = ("libtorch_cpu", "libonnxruntime", "onnxruntime_pybind", "libopenvino.so")


def role(p: psutil.Process) -> str:
    """The stage a process belongs to: its ingest-<role> name, ray for Ray's own processes, else (old code)
    encode if it loaded a runtime."""
    try:
        name = p.name()
        if name.startswith("ingest-"):
            return name.removeprefix("ingest-")
        if name.startswith(("ray", "gcs_server")):
            return "ray"
        if any(lib in m.path for m in p.memory_maps() for lib in ENCODE_LIBS):
            return "encode"
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass
    return "other"


def children_cpu() -> float:
    return sum(children_split())


def children_split() -> tuple[float, float]:
    """(user, system) CPU seconds of the reaped children."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime, r.ru_stime


def sampled_run(argv: list[str], cwd: Path, env: dict, every_s: float = 0.1) -> dict:
    """Run `argv` to its end, sampling its process tree every `every_s`: wall seconds, the tree's CPU seconds,
    CPU seconds by role ("supervisor": the command's own process), peak RSS (bytes) of one process by role,
    the exit code and stderr; `split`: (user, system) CPU seconds by role and of the tree ("tree")."""
    before = children_split()
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    top = psutil.Process(proc.pid)
    last: dict[int, tuple[str, float, float]] = {}
    roles: dict[int, str] = {}
    peak: dict[str, int] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            try:
                tree = [top] + top.children(recursive=True)
            except psutil.NoSuchProcess:
                break
            for p in tree:
                try:
                    with p.oneshot():
                        t, rss = p.cpu_times(), p.memory_info().rss
                    if p.pid not in roles or roles[p.pid] == "other":
                        roles[p.pid] = "supervisor" if p.pid == proc.pid else role(p)
                    last[p.pid] = (roles[p.pid], t.user, t.system)
                    peak[roles[p.pid]] = max(peak.get(roles[p.pid], 0), rss)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
            time.sleep(every_s)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, stderr = proc.communicate()
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    stages: dict[str, float] = {}
    split: dict[str, tuple[float, float]] = {}
    for name, user, system in last.values():
        stages[name] = stages.get(name, 0.0) + user + system
        u, s = split.get(name, (0.0, 0.0))
        split[name] = (u + user, s + system)
    after = children_split()
    split["tree"] = (after[0] - before[0], after[1] - before[1])
    # A process its parent never reaped is missing from RUSAGE_CHILDREN but was sampled: take the larger.
    tree = max(sum(split["tree"]), sum(stages.values()))
    stages["unsampled"] = tree - sum(stages.values())
    return {"wall": wall, "tree": tree, "stages": stages, "split": split, "peak_rss": peak, "rc": proc.returncode,
            "stderr": stderr}
