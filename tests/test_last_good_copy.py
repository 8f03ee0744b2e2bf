"""Issue 20, items 1-3: a run never loses the last good copy of a file. A new version that fails part-way
leaves the old one whole (both engines); --prune never deletes what the scan could not see; a run that lost
its server lease deletes nothing more, and a lease is taken over only when its holder is surely gone.
Real CLI, real Milvus (Lite and a server), real file permissions, a real Ray cluster."""
from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import Result, cli_env, ray_config, run, run_on, server_rows, sqlite, store_rows
from ingest.store.manifest import manifest_path

PLUGIN = '[loaders]\nplugins = ["last_good_loaders"]\n'
SMALL = ('[model]\nbackend = "null"\n[chunking]\nchunk_tokens = 24\noverlap_tokens = 4\n[store]\nbatch_size = 8\n'
         + PLUGIN)
WORDS = ["amber", "basalt", "cedar", "delta", "ember", "fjord", "granite", "harbor", "indigo", "juniper", "kelp",
         "lagoon", "marble", "nectar", "obsidian", "prairie", "quartz", "river", "saffron", "tundra"]


def paragraphs(tag: str, n: int) -> list[str]:
    """n paragraphs of about three chunks each (24 tokens), all different."""
    return [f"{tag} paragraph {i}: " + " ".join(f"{WORDS[(i * 7 + k) % 20]}-{tag}{i}-{k}" for k in range(30))
            for i in range(n)]


def by_source(rows: list[dict]) -> dict[str, dict[str, str]]:
    """source -> {id: file_hash}."""
    out: dict[str, dict[str, str]] = {}
    for r in rows:
        out.setdefault(r["source"], {})[r["id"]] = r["file_hash"]
    return out


def _rows(uri: str, _work: Path) -> list[dict]:
    """Every row's id, source and file_hash of the store at `uri`, read by a process of its own."""
    code = ("import json, sys; from ingest.store.factory import open_store\n"
            "s = open_store(sys.argv[1], 'documents')\n"
            "print(json.dumps(s.rows(['id', 'source', 'file_hash']) if s.exists() else []))")
    proc = subprocess.run([sys.executable, "-c", code, uri], capture_output=True, text=True, env=cli_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _entries(uri: str, _work: Path) -> dict[str, str]:
    with sqlite(manifest_path(uri, "documents")) as con:
        return dict(con.execute("SELECT source, file_hash FROM files"))


def lite_entries(work: Path) -> dict[str, str]:
    """source -> file_hash, as the Lite store's manifest records it."""
    with sqlite(work / "store.db.documents.manifest.sqlite") as con:
        return dict(con.execute("SELECT source, file_hash FROM files"))


# -- item 1: a new version that fails part-way ------------------------------------------------
def _versions(docs: Path) -> tuple[str, str, str]:
    """Write keep.paged v1 and return (v1, v2, v3) texts: v2 keeps v1's pages, adds four and a page the store
    refuses (after the batches before it were stored); v3 is v2 without that page."""
    v1 = paragraphs("keep", 10)
    v2 = v1 + paragraphs("more", 4)
    (docs / "keep.paged").write_text("\n\n".join(v1))
    return "\n\n".join(v1), "\n\n".join(v2 + ["OVERFLOW"]), "\n\n".join(v2)


def _fails_part_way(res: Result) -> None:
    files = res.by_path()
    for name in ("keep.paged", "fresh.paged"):
        assert files[name]["status"] == "failed" and "refused" in files[name]["error"], files[name]


@pytest.mark.slow
@pytest.mark.parametrize("store", ["milvus-lite", "lancedb"])
def test_a_version_that_fails_part_way_keeps_the_last_good_copy(work: Path, store: str) -> None:
    docs = work / "docs"
    uri = str(work / "store.db") if store == "milvus-lite" else f"lancedb://{work / 'lance'}"
    run = functools.partial(run_on, uri, "documents")
    store_rows = functools.partial(_rows, uri)
    lite_entries = functools.partial(_entries, uri)
    _, v2, v3 = _versions(docs)
    first = run(work, config=SMALL)
    assert first.rc == 0, first.stderr
    good = by_source(store_rows(work))["keep.paged"]
    assert len(good) == first.by_path()["keep.paged"]["chunks"] >= 20
    old_hash = lite_entries(work)["keep.paged"]

    (docs / "keep.paged").write_text(v2)                              # changed: fails after some batches
    (docs / "fresh.paged").write_text("\n\n".join(paragraphs("fresh", 6) + ["OVERFLOW"]))   # new: the same
    second = run(work, config=SMALL)
    assert second.rc == 1, second.stderr
    _fails_part_way(second)
    rows = by_source(store_rows(work))
    assert rows["keep.paged"] == good                                 # the old version whole, nothing of the new
    assert "fresh.paged" not in rows                                  # no partial rows of a file never stored
    assert lite_entries(work) == {"keep.paged": old_hash}             # the old entry: the next run redoes it

    (docs / "keep.paged").write_text(v3)
    (docs / "fresh.paged").unlink()
    third = run(work, config=SMALL)
    assert third.rc == 0 and third.by_path()["keep.paged"]["status"] == "ingested", third.stderr
    rows = by_source(store_rows(work))
    assert set(rows) == {"keep.paged"} and set(rows["keep.paged"].values()) == {lite_entries(work)["keep.paged"]}
    assert len(rows["keep.paged"]) == third.by_path()["keep.paged"]["chunks"]
    assert not set(rows["keep.paged"]) & set(good)                    # the old version's rows went with it


@pytest.mark.slow
def test_ray_a_part_refused_leaves_no_orphan_rows_and_the_last_good_copy(milvus_uri: str, ray_address: str,
                                                                         work: Path) -> None:
    docs, collection = work / "docs", "h1_ray_partial"
    _, v2, _ = _versions(docs)
    first = run_on(milvus_uri, collection, work, config=SMALL)
    assert first.rc == 0, first.stderr
    good = by_source(server_rows(milvus_uri, collection))["keep.paged"]
    assert len(good) == first.by_path()["keep.paged"]["chunks"] >= 20

    (docs / "keep.paged").write_text(v2)
    (docs / "fresh.paged").write_text("\n\n".join(paragraphs("fresh", 6) + ["OVERFLOW"]))
    second = run_on(milvus_uri, collection, work, config=SMALL + ray_config(ray_address))
    assert second.rc == 1, second.stderr
    _fails_part_way(second)
    rows = by_source(server_rows(milvus_uri, collection))
    assert rows["keep.paged"] == good
    assert "fresh.paged" not in rows


# -- item 2: --prune and folders that cannot be listed -------------------------------------------
def _without_permission_override() -> list[str]:
    """An argv prefix under which this user cannot read what file permissions forbid: root keeps its uid
    (the venv and store stay readable) but loses CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root and setpriv (util-linux) is missing: cannot make a folder unlistable")
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]


@pytest.mark.slow
def test_prune_never_deletes_what_it_could_not_list_or_stat(work: Path) -> None:
    docs = work / "docs"
    for rel in ("a.txt", "gone.txt", "sub/b.txt", "sub/deep/c.txt", "noexec/d.txt"):
        (docs / rel).parent.mkdir(parents=True, exist_ok=True)
        (docs / rel).write_text(f"The file {rel} tells of " + " ".join(WORDS[len(rel):]))
    first = run(docs, work, config=SMALL)
    assert first.rc == 0, first.stderr
    sources = {"a.txt", "sub/b.txt", "sub/deep/c.txt", "noexec/d.txt"}
    assert set(lite_entries(work)) == sources | {"gone.txt"}

    (docs / "gone.txt").unlink()
    prefix = _without_permission_override()
    try:
        (docs / "sub").chmod(0o000)                     # cannot be listed
        (docs / "noexec").chmod(0o444)                  # listed, but its files cannot be stat'ed
        probe = subprocess.run([*prefix, sys.executable, "-c", f"import os; os.listdir({str(docs / 'sub')!r})"],
                               capture_output=True, text=True)
        if "PermissionError" not in probe.stderr:
            pytest.skip(f"cannot make a folder unlistable here: {probe.stderr.strip()[-200:] or 'listed'}")
        (work / "report.json").unlink(missing_ok=True)
        proc = subprocess.run([*prefix, sys.executable, "-m", "ingest.cli", "run", str(docs), "--store",
                               str(work / "store.db"), "--report", str(work / "report.json"), "--quiet", "--prune"],
                              cwd=work, capture_output=True, text=True, env=cli_env(), timeout=600)
    finally:
        (docs / "sub").chmod(0o755)
        (docs / "noexec").chmod(0o755)
    assert proc.returncode == 1, proc.stderr
    report = json.loads((work / "report.json").read_text())
    files = {f["path"]: f for f in report["files"]}
    assert files["sub"]["status"] == "failed" and "cannot list folder" in files["sub"]["error"], files["sub"]
    assert files["noexec/d.txt"]["status"] == "failed" and "permission" in files["noexec/d.txt"]["error"]
    assert report["totals"]["pruned"] == 1                             # gone.txt, and nothing it could not see
    assert set(lite_entries(work)) == sources
    assert set(by_source(store_rows(work))) == sources


# -- item 3: fencing and lease takeover -----------------------------------------------------------
def _intrude(uri: str, collection: str, **holder: object) -> None:
    """Overwrite the collection's lease row, as another run would."""
    from ingest.store.server_manifest import LEASE_KEY, _row, companion_name
    from ingest.store import Store

    now = time.time()
    value = {"host": "elsewhere", "pid": 1, "run": "intruder", "since": now, "expires": now + 3600, **holder}
    store = Store(uri, collection)
    try:
        store.call("write the lease", "upsert", companion_name(collection), [_row(LEASE_KEY, value=json.dumps(value))])
    finally:
        store.close()


def _wait_for(path: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300
    while not path.exists():
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before {path.name} appeared"
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.1)


@pytest.mark.slow
def test_a_run_whose_lease_is_taken_over_deletes_nothing_more(milvus_uri: str, work: Path) -> None:
    docs, collection = work / "docs", "h1_fenced"
    for name in ("changed.txt", "deleted.txt"):
        (docs / name).write_text(" ".join(paragraphs(name, 2)))
    first = run_on(milvus_uri, collection, work, config=SMALL)
    assert first.rc == 0, first.stderr
    before, entries = by_source(server_rows(milvus_uri, collection)), server_entries(milvus_uri, collection)

    (docs / "changed.txt").write_text(" ".join(paragraphs("changed again", 2)))
    (docs / "deleted.txt").unlink()
    (docs / "a.gated").write_text("Held at the gate until the test has taken the lease away.")
    proc = subprocess.Popen([sys.executable, "-m", "ingest.cli", "run", "docs", "--store", milvus_uri,
                             "--collection", collection, "--report", "report.json", "--quiet", "--prune"],
                            cwd=work, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(work / "a.gated.waiting", proc)      # the run holds the lease and is loading
        _intrude(milvus_uri, collection)
        (work / "go").write_text("x")
        _, stderr = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2 and stderr.strip().count("\n") == 0, stderr
    assert "taken over" in stderr and "elsewhere" in stderr, stderr
    after = by_source(server_rows(milvus_uri, collection))
    for source, rows in before.items():                              # no stale row deleted, nothing pruned
        assert set(rows.items()) <= set(after.get(source, {}).items()), source
    assert server_entries(milvus_uri, collection) == entries           # nothing recorded, nothing removed
    report = json.loads((work / "report.json").read_text())
    assert "taken over" in report["totals"]["stopped_by"] and report["totals"]["pruned"] == 0


def server_entries(uri: str, collection: str) -> dict[str, str]:
    """source -> file_hash, as a server collection's manifest records it."""
    from ingest.store.server_manifest import ServerManifest
    from ingest.store import Store

    store = Store(uri, collection)
    try:
        return {s: e.file_hash for s, e in ServerManifest(store, None).all().items()}
    finally:
        store.close()


@pytest.mark.slow
def test_a_dead_pid_in_another_pid_namespace_is_not_taken_for_a_dead_run(milvus_uri: str, work: Path) -> None:
    docs, collection = work / "docs", "h1_namespaces"
    (docs / "a.txt").write_text("Lanterns were carried ahead of the night train.")
    assert run_on(milvus_uri, collection, work, config=SMALL).rc == 0
    gone = subprocess.Popen(["true"])
    gone.wait()                                      # a pid that no longer exists, on this host
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    pidns = os.readlink("/proc/self/ns/pid")
    fresh = {"host": socket.gethostname(), "pid": gone.pid, "expires": time.time() + 3600}
    for where in ({}, {"boot": "another-boot", "pidns": pidns}, {"boot": boot, "pidns": "pid:[1]"}):
        _intrude(milvus_uri, collection, **fresh, **where)            # another container, same host name
        res = run_on(milvus_uri, collection, work, config=SMALL)
        assert res.rc == 2 and "in use" in res.stderr and res.stderr.strip().count("\n") == 0, (where, res.stderr)
    _intrude(milvus_uri, collection, **fresh, boot=boot, pidns=pidns)   # this host, boot and namespace: dead
    assert run_on(milvus_uri, collection, work, config=SMALL).rc == 0, "a dead run on this host must not block"
    _intrude(milvus_uri, collection, **{**fresh, "expires": time.time() - 1}, boot="another-boot")
    assert run_on(milvus_uri, collection, work, config=SMALL).rc == 0, "a lease without heartbeat is stale"
