"""Issue 12: `ingest run --engine ray` on a real Ray cluster (one for the session) writing to a real Milvus
server on loopback (`milvus-lite server`): the same rows as the local engine, the same incremental
semantics, and faults that cost a file, an actor's batch or a rerun, never rows."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import psutil

from conftest import cli_env, ingest, ray_config, run_on, server_rows
from ingest.files import INTERRUPTED
from test_faults import FAULT_CONFIG
from test_pipeline import PHRASES, build_folder

NULL = '[model]\nbackend = "null"\n'
SENTENCES = ["Beavers build dams that turn streams into ponds.", "Comets grow tails when they near the sun.",
             "Glassblowers shape molten sand with breath and patience.", "Tides follow the moon around the planet."]


def ids(uri: str, collection: str) -> set[str]:
    rows = server_rows(uri, collection)
    assert len(rows) == len({r["id"] for r in rows})
    return {r["id"] for r in rows}


def many_texts(docs: Path, n: int, ext: str = "txt") -> None:
    """n text files of a few chunks each, every one different."""
    for i in range(n):
        body = "\n\n".join(f"File {i}, paragraph {j}: " + " ".join(SENTENCES[(i + j + k) % 4] for k in range(25))
                           for j in range(3))
        (docs / f"f{i:03}.{ext}").write_text(body)


@pytest.mark.slow
def test_same_rows_as_the_local_engine_and_the_same_incremental_runs(milvus_uri: str, ray_address: str,
                                                                     work: Path) -> None:
    build_folder(work / "docs")
    local = run_on(milvus_uri, "eng_local", work)
    ray = run_on(milvus_uri, "eng_ray", work, config=ray_config(ray_address))
    assert local.rc == ray.rc == 1, ray.stderr                           # broken.pdf fails in both
    assert ray.report and ray.report["totals"]["engine"] == "ray", ray.stderr
    strip = lambda res: {p: (f["status"], f["chunks"], f.get("error")) for p, f in res.by_path().items()}
    assert strip(ray) == strip(local)
    assert ids(milvus_uri, "eng_ray") == ids(milvus_uri, "eng_local")
    for name, phrase in PHRASES.items():
        hits = ingest("search", phrase, "--json", "--store", milvus_uri, "--collection", "eng_ray", cwd=work)
        assert hits.rc == 0, hits.stderr
        assert name in hits.stdout, (name, hits.stdout)

    again = run_on(milvus_uri, "eng_ray", work)                          # config.toml still says ray
    assert again.rc == 1 and "ingested" not in again.report["totals"]["by_status"], again.report["totals"]
    assert again.report["totals"]["by_status"]["unchanged"] == len(PHRASES)

    docs = work / "docs"
    (docs / "notes.txt").write_text("Copper kettles were replaced by electric ones in the harbour town.\n")
    (docs / "guide.md").unlink()
    changed = run_on(milvus_uri, "eng_ray", work, "--prune")
    (work / "config.toml").unlink()
    changed_local = run_on(milvus_uri, "eng_local", work, "--prune")
    assert changed.rc == changed_local.rc == 1, changed.stderr
    assert changed.by_path()["notes.txt"]["status"] == "ingested" and changed.report["totals"]["pruned"] == 1
    assert strip(changed) == strip(changed_local)
    assert ids(milvus_uri, "eng_ray") == ids(milvus_uri, "eng_local")


@pytest.mark.slow
def test_loader_faults_cost_only_their_file(milvus_uri: str, ray_address: str, work: Path) -> None:
    docs = work / "docs"
    for ext in ("sleep", "segv"):
        (docs / f"bad.{ext}").write_text("x")
    (docs / "good.txt").write_text("Bees dance to tell the hive where the flowers are.")
    res = run_on(milvus_uri, "eng_faults", work, config=FAULT_CONFIG + NULL + ray_config(ray_address))
    assert res.rc == 1, res.stderr
    files = res.by_path()
    assert files["bad.sleep"]["status"] == "failed" and files["bad.sleep"]["error"] == "timeout after 3 s"
    assert "SIGSEGV" in files["bad.segv"]["error"] and "retried once" in files["bad.segv"]["error"]
    assert files["good.txt"]["status"] == "ingested"
    assert len(ids(milvus_uri, "eng_faults")) == files["good.txt"]["chunks"]


def _encode_actor(driver: subprocess.Popen, timeout: float = 180) -> psutil.Process:
    """The Ray actor process that hosts the run's EncodePool, once its encode worker runs: one of this
    session's cluster (another pytest-xdist worker runs a cluster of its own)."""
    head = psutil.Process(int(os.environ["INGEST_TEST_RAY_HEAD"]))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and driver.poll() is None:
        for proc in head.children(recursive=True):
            cmdline: list[str] = []
            with contextlib.suppress(psutil.Error):
                cmdline = proc.cmdline()
            if "EncodeParts" in " ".join(cmdline or ()):
                try:
                    if any("ingest-encode" in c.name() for c in proc.children()):
                        return proc
                except psutil.Error:
                    pass
        time.sleep(0.3)
    raise AssertionError(f"no encode actor with a running encode worker (driver exit {driver.poll()})")


def _start(work: Path, collection: str, uri: str, config: str, **env: str) -> subprocess.Popen:
    (work / "config.toml").write_text(config)
    return subprocess.Popen([sys.executable, "-m", "ingest.cli", "run", "docs", "--store", uri, "--collection",
                             collection, "--report", "report.json", "--quiet"], cwd=work, env=dict(cli_env(), **env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


@pytest.mark.slow
def test_a_killed_encode_actor_is_replaced_and_its_batch_redone(milvus_uri: str, ray_address: str,
                                                                 work: Path) -> None:
    many_texts(work / "docs", 40)
    clean = run_on(milvus_uri, "actor_clean", work, config=NULL)
    assert clean.rc == 0, clean.stderr
    slow = '{"match": "", "action": "delay", "seconds": 2}'              # each batch: up to 2 s
    driver = _start(work, "actor_kill", milvus_uri, NULL + ray_config(ray_address), INGEST_FAULT=slow)
    actor = _encode_actor(driver)
    time.sleep(2)
    assert driver.poll() is None, driver.communicate()
    actor.kill()
    out, err = driver.communicate(timeout=300)
    assert driver.returncode == 0, err
    assert ids(milvus_uri, "actor_kill") == ids(milvus_uri, "actor_clean")


@pytest.mark.slow
def test_a_sigkilled_driver_leaves_a_rerun_with_exactly_the_clean_rows(milvus_uri: str, ray_address: str,
                                                                       work: Path, monkeypatch) -> None:
    monkeypatch.setenv("INGEST_TEST_SLOW_S", "0")           # the clean run and the rerun load at full speed
    many_texts(work / "docs", 16, ext="slowtxt")
    plugins = '[loaders]\nplugins = ["fault_loaders"]\n'
    clean = run_on(milvus_uri, "driver_clean", work, config=plugins + NULL)
    assert clean.rc == 0, clean.stderr
    driver = _start(work, "driver_kill", milvus_uri, plugins + NULL + ray_config(ray_address),
                    INGEST_TEST_SLOW_S="1")
    deadline = time.monotonic() + 180
    while not server_rows(milvus_uri, "driver_kill") and time.monotonic() < deadline and driver.poll() is None:
        time.sleep(0.3)
    assert driver.poll() is None, driver.communicate()
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    rerun = run_on(milvus_uri, "driver_kill", work)
    assert rerun.rc == 0, rerun.stderr
    assert set(rerun.report["totals"]["by_status"]) <= {"ingested", "unchanged"}
    assert ids(milvus_uri, "driver_kill") == ids(milvus_uri, "driver_clean")


def test_a_milvus_lite_file_cannot_be_written_from_a_cluster(work: Path) -> None:
    (work / "docs" / "a.txt").write_text("Kites rise against the wind, not with it.")
    res = ingest("run", "docs", "--store", "lite.db", cwd=work, config=ray_config("auto"))
    assert res.rc == 2 and res.stderr.strip().count("\n") == 0, res.stderr
    assert "Milvus Lite file" in res.stderr and "server URI" in res.stderr


@pytest.mark.slow
def test_sigterm_stops_a_run_that_started_its_own_ray_with_a_report(milvus_uri: str, work: Path) -> None:
    """ray.init of a local Ray installs a SIGTERM handler that exits 1: the run's own comes back. Issue 22:
    the driver streams the scan into load tasks, so the first rows come while most of the folder is unread."""
    many_texts(work / "docs", 16, ext="slowtxt")
    for i in range(2500):                        # far more than the load tasks in flight hold (12 tasks here)
        folder = work / "docs" / f"more{i // 500}"
        folder.mkdir(exist_ok=True)
        (folder / f"m{i:04}.slowtxt").write_text(f"Slow note {i}: otters hold hands while they sleep.")
    config = '[loaders]\nplugins = ["fault_loaders"]\n' + NULL + '[run]\nengine = "ray"\n[ray]\ncpus = 3\n'
    driver = _start(work, "ray_sigterm", milvus_uri, config, INGEST_TEST_SLOW_S="1")
    deadline = time.monotonic() + 240
    while not server_rows(milvus_uri, "ray_sigterm") and time.monotonic() < deadline and driver.poll() is None:
        time.sleep(0.3)
    assert driver.poll() is None, driver.communicate()
    driver.send_signal(signal.SIGTERM)
    out, err = driver.communicate(timeout=120)
    assert driver.returncode == 143, err
    report = json.loads((work / "report.json").read_text())
    totals = report["totals"]
    assert totals["signal"] == "SIGTERM" and totals["interrupted"] and totals["exit_code"] == 143, totals
    assert totals["scan_finished"] is False and totals["not_started"] is None, totals
    assert 8 <= totals["files"] < 2516 and totals["by_status"].get("ingested", 0) >= 1, totals
    assert {f["error"] for f in report["files"] if f["status"] == "failed"} <= {INTERRUPTED}


@pytest.mark.slow
def test_a_big_file_streams_by_range_with_the_local_engines_rows_and_a_failing_range_keeps_the_last_good_copy(
        milvus_uri: str, ray_address: str, work: Path, monkeypatch) -> None:
    """Issue 22 item 2 on Ray: a load task yields a big file's ranges as they load (ray_stages.load_streamed),
    numbered parts whose count comes with the last; a range that fails fails the file, the old rows stay."""
    from test_big_files import _markdown, _rows

    docs = work / "docs"
    (docs / "manual.md").write_text(_markdown(30, 40), encoding="utf-8")            # ~0.5 MB: ~16 ranges
    lines = [f"line{i:05d} " + " ".join(SENTENCES[i % 4].split()[:6]) for i in range(6000)]
    (docs / "log.txt").write_text("\n".join(lines), encoding="utf-8")               # ~0.3 MB: ~9 ranges
    monkeypatch.setenv("INGEST_RANGE_BYTES", "32768")
    config = NULL + "[limits]\nmax_text_mb = 1\n"
    local = run_on(milvus_uri, "big_local", work, config=config)
    ray = run_on(milvus_uri, "big_ray", work, config=config + ray_config(ray_address))
    assert local.rc == ray.rc == 0, ray.stderr
    assert {p: f["chunks"] for p, f in ray.by_path().items()} == {p: f["chunks"] for p, f in local.by_path().items()}
    strip = lambda rows: [{k: r[k] for k in ("source", "chunk", "text", "headings")} for r in rows]
    got = _rows(milvus_uri, "big_ray")
    assert len(got) > 100 and strip(got) == strip(_rows(milvus_uri, "big_local"))

    good = ids(milvus_uri, "big_ray")
    (docs / "log.txt").write_text("\n".join(lines[:3000] + ["x" * (1200 * 1024)] + lines[3000:]), encoding="utf-8")
    again = run_on(milvus_uri, "big_ray", work, config=config + ray_config(ray_address))
    assert again.rc == 1, again.stderr
    files = again.by_path()
    assert files["log.txt"]["status"] == "failed" and "loading bytes" in files["log.txt"]["error"], files
    assert files["manual.md"]["status"] == "unchanged"
    assert ids(milvus_uri, "big_ray") == good                   # the old version, whole; none of the new one's rows


def test_a_load_task_yields_a_big_files_ranges_as_they_load(work: Path, monkeypatch) -> None:
    """ray_stages.load_streamed in this process: a file of ~16 ranges comes as pieces, in order, the first
    before the later ranges load (at most RANGES_AHEAD + 1 loading), so a load task never holds it whole."""
    from test_big_files import _markdown

    from ingest import load
    from ingest.config import FORMAT_POOLS, chunk_spec, load_config, loader_options, ocr_options
    from ingest.engines.ray_stages import RANGES_AHEAD, load_streamed
    from ingest.files import FileRef
    from ingest.model_ref import resolve_model
    from ingest.workers.pool import Pools

    monkeypatch.setenv("INGEST_RANGE_BYTES", "32768")
    path = work / "manual.md"
    path.write_text(_markdown(30, 40), encoding="utf-8")
    cfg = load_config(None)
    ref = FileRef(0, "manual.md", str(path), path.stat().st_size, path.stat().st_mtime_ns, fmt="md")
    pools = Pools({p: 1 for p in FORMAT_POOLS}, {p: 60.0 for p in FORMAT_POOLS}, load.init_loader_process, ((), 0))
    submitted: list[int] = []
    real = load.submit_range
    monkeypatch.setattr(load, "submit_range", lambda *a: submitted.append(1) or real(*a))
    try:
        pieces = load_streamed(pools, load.Job(ref, None, "", 0), loader_options(cfg), ocr_options(cfg),
                               chunk_spec(cfg, resolve_model()), 60.0)
        first = next(pieces)
        assert not first.last and first.start == 0 and first.chunk_count > 0
        assert len(submitted) <= RANGES_AHEAD + 1                # the rest of the file is not loading yet
        rest = list(pieces)
    finally:
        pools.stop()
    assert len(rest) >= 10 and rest[-1].last and rest[-1].outcome.status == "ingested"
    starts = [p.start for p in [first, *rest]]
    assert starts == sorted(starts) and rest[-1].outcome.chunks == sum(p.chunk_count for p in [first, *rest])
